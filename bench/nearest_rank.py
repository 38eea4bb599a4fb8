"""The nearest-rank percentile the bench scripts report latencies by (stdlib only)."""

from __future__ import annotations

from collections.abc import Iterable


def nearest_rank(values: Iterable[float], q: float) -> float:
    """The q-quantile (0..1) of `values` by nearest rank: the sorted value at index
    floor(q * n), the largest for q near 1; `values` must not be empty."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
