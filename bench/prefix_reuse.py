"""Prefix reuse benchmark: multi-tenant, multi-turn chat with per-tenant system prompts.

Workload (the seed design target, scaled by --scale to the machine): --tenants
tenants, each with a --system-tokens system prompt behind one published prefix
shared by all; --convs conversations per tenant of --turns turns, user turns of
--user-tokens tokens; conversations start as a Poisson process (--rate per second)
and each next turn follows its answer after an exponential think time.

Prints the realized token-weighted reuse against the replay upper bound (computed
within tenants, block-aligned, infinite cache, published prefix shared), mean /
p50 / p95 TTFT with the cache on and off for hash and radix, and the same with
isolation on versus one shared domain (the cost of isolation). The last line is JSON.

    python bench/prefix_reuse.py --scale 0.25
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nearest_rank import nearest_rank  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


@dataclass
class Conversation:
    """One tenant's chat: its token history grows by user turn and answer."""

    tenant: int
    history: list[int]
    turns_left: int
    ready_at: float
    user_turns: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    """One configuration's figures."""

    name: str
    reuse: float
    upper_bound: float
    ttft_mean: float
    ttft_p50: float
    ttft_p95: float
    requests: int


def replay_upper_bound(prompts: list[tuple[int, list[int]]], published: int, bs: int) -> float:
    """Token-weighted reuse an infinite, per-tenant, block-aligned cache would reach."""
    seen: dict[int, set[tuple[int, ...]]] = {}
    public: set[tuple[int, ...]] = set()
    total = reused = 0
    for tenant, ids in prompts:
        own = seen.setdefault(tenant, set())
        n = 0
        while (n + 1) * bs <= len(ids) - 1:
            key = tuple(ids[: (n + 1) * bs])
            if key not in own and not ((n + 1) * bs <= published and key in public):
                break
            n += 1
        total += len(ids)
        reused += n * bs
        for k in range(1, len(ids) // bs + 1):
            own.add(tuple(ids[: k * bs]))
            if k * bs <= published:
                public.add(tuple(ids[: k * bs]))
    return reused / max(1, total)


def run(args: argparse.Namespace, mode: str, isolated: bool) -> Result:
    """Serves the whole workload once; returns reuse and TTFT figures."""
    rng = random.Random(args.seed)
    engine = LLMEngine.from_options(
        args.model, prefix_cache=mode, num_blocks=args.num_blocks, block_size=args.block_size
    )
    vocab = list(range(300, 5000))
    published = [rng.choice(vocab) for _ in range(int(256 * args.scale))]
    engine.publish_prefix(published)
    systems = [
        [rng.choice(vocab) for _ in range(int(args.system_tokens * args.scale))]
        for _ in range(args.tenants)
    ]
    params = SamplingParams(max_tokens=args.answer_tokens, temperature=0, ignore_eos=True)
    start_clock = 0.0
    convs: list[Conversation] = []
    for t in range(args.tenants):
        for _ in range(args.convs):
            start_clock += rng.expovariate(args.rate)
            turns = [
                [rng.choice(vocab) for _ in range(int(args.user_tokens * args.scale))]
                for _ in range(args.turns)
            ]
            convs.append(Conversation(t, published + systems[t], args.turns, start_clock, turns))
    live: dict[str, tuple[Conversation, float, list[int]]] = {}
    ttfts: list[float] = []
    cached = prompt_tokens = 0
    prompts: list[tuple[int, list[int]]] = []
    t0 = time.perf_counter()
    while any(c.turns_left for c in convs) or live:
        now = time.perf_counter() - t0
        for c in convs:
            if c.turns_left and c.ready_at <= now and all(v[0] is not c for v in live.values()):
                ids = c.history + c.user_turns[args.turns - c.turns_left]
                domain = f"t:{c.tenant}" if isolated else "t:shared"
                rid = engine.add_request(
                    EngineRequest(prompt_token_ids=tuple(ids), params=params, cache_domain=domain)
                )
                live[rid] = (c, time.perf_counter(), ids)
                prompts.append((c.tenant if isolated else 0, ids))
                c.turns_left -= 1
        if not engine.has_unfinished():
            time.sleep(min(0.01, max(0.0, min(c.ready_at for c in convs if c.turns_left) - now)))
            continue
        for event in engine.step():
            c, sent, ids = live[event.request_id]
            if sent >= 0:
                ttfts.append(time.perf_counter() - sent)
                cached += event.num_cached_tokens
                prompt_tokens += len(ids)
                live[event.request_id] = (c, -1.0, ids)
            if event.finished:
                answer = [t for d in event.deltas for t in d.token_ids]
                c.history = ids + answer
                c.ready_at = time.perf_counter() - t0 + rng.expovariate(args.rate)
                del live[event.request_id]
    name = f"{mode}{'' if isolated else '-shared'}"
    return Result(
        name,
        cached / max(1, prompt_tokens),
        replay_upper_bound(prompts, len(published), args.block_size),
        statistics.fmean(ttfts),
        nearest_rank(ttfts, 0.5),
        nearest_rank(ttfts, 0.95),
        len(ttfts),
    )


def main() -> None:
    """Parses options, runs every configuration, prints a table and a JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2)")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--convs", type=int, default=1, help="conversations per tenant")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=1800)
    ap.add_argument("--user-tokens", type=int, default=200)
    ap.add_argument("--answer-tokens", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies token counts")
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per second")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    results = [
        run(args, "off", True),
        run(args, "hash", True),
        run(args, "radix", True),
        run(args, "hash", False),
    ]
    print(f"{'config':14} {'reuse':>7} {'bound':>7} {'ttft mean':>10} {'p50':>8} {'p95':>8}")
    for r in results:
        print(
            f"{r.name:14} {r.reuse:7.3f} {r.upper_bound:7.3f} "
            f"{r.ttft_mean:10.3f} {r.ttft_p50:8.3f} {r.ttft_p95:8.3f}"
        )
    off = results[0]
    summary = {
        "configs": {r.name: r.__dict__ for r in results},
        "reuse_vs_bound": {r.name: r.reuse / max(1e-9, r.upper_bound) for r in results[1:]},
        "p50_speedup": {r.name: off.ttft_p50 / max(1e-9, r.ttft_p50) for r in results[1:]},
        "isolation_cost_p50": results[1].ttft_p50 / max(1e-9, results[3].ttft_p50),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
