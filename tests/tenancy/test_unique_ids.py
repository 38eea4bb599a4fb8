"""Request and lease ids: unique within and across gateway processes, in OpenAI's `<kind>-<hex>` shape."""

from __future__ import annotations

import re

from tenancy.unique_ids import UniqueIds


def test_ids_are_unique_within_and_across_generators() -> None:
    a, b = UniqueIds(), UniqueIds()  # two gateway processes
    ids = [a.next("chatcmpl") for _ in range(1000)] + [b.next("chatcmpl") for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids)
    assert a.next("cmpl").startswith("cmpl-")
    assert re.fullmatch(r"[0-9a-f]{24}", a.next())  # a limiter lease id


def test_ids_reveal_no_count() -> None:
    """Issue 46: consecutive ids are unrelated, so no tenant can count others' requests."""
    ids = UniqueIds()
    values = [int(ids.next(), 16) for _ in range(2000)]
    assert all(v < 2**96 for v in values)
    gaps = {b - a for a, b in zip(values, values[1:], strict=False)}
    assert len(gaps) == len(values) - 1  # not a counter: no constant step between them
    # Each of the 96 bits is set in about half the ids (a counter's high bits never are).
    for bit in range(96):
        ones = sum(v >> bit & 1 for v in values)
        assert 800 < ones < 1200, bit
    # Two instances (two gateways) share no structure either: no common prefix.
    a, b = UniqueIds().next(), UniqueIds().next()
    assert a != b and a[:12] != b[:12]
