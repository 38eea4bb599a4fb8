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
