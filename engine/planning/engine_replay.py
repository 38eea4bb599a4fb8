"""Replays a traffic sample through the real engine, to hold the reuse bound to a hit rate.

Requests run one at a time in arrival order (one output token each, greedy), each in
its tenant's cache domain or in one shared domain, so the engine's prefix cache (its
block size, its pool and its eviction) decides what is found. The sum of the
engine's `num_cached_tokens` over the prompt tokens is the observed hit rate.
"""

from __future__ import annotations

from collections.abc import Sequence

from tqdm import tqdm

from engine.llm import LLM
from engine.planning.reuse import SHARED_DOMAIN, ReuseReport, TrafficRecord
from engine.sampling_params import SamplingParams


def replay_on_engine(
    llm: LLM, records: Sequence[TrafficRecord], *, isolated: bool = True, progress: bool = False
) -> ReuseReport:
    """The engine-observed reuse of `records` (shared = tokens the engine found cached)."""
    params = SamplingParams(temperature=0.0, max_tokens=1)
    per_tenant: dict[str, tuple[int, int]] = {}
    shared_total = input_total = 0
    ordered = sorted(records, key=lambda r: r.timestamp)
    for record in tqdm(ordered, desc="replaying", unit="req", disable=not progress):
        domain = record.tenant if isolated else SHARED_DOMAIN
        (out,) = llm.generate([list(record.token_ids)], params, cache_domain=domain)
        cached = out.num_cached_tokens
        shared, total = per_tenant.get(record.tenant, (0, 0))
        per_tenant[record.tenant] = (shared + cached, total + len(record.token_ids))
        shared_total += cached
        input_total += len(record.token_ids)
    return ReuseReport(len(ordered), input_total, shared_total, per_tenant)
