"""Reading Prometheus text exposition (a /metrics body) in tests."""

from __future__ import annotations


def labelled_samples(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their label text (what stands inside the braces)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            out[labels] = float(value)
    return out
