"""KV tiers benchmark: multi-tenant multi-turn chat whose working set outgrows the pool.

Workload: --tenants tenants, each with one conversation of --turns turns over its own
--system-tokens system prompt (tenants come in pairs with the SAME system prompt, so
that a cross-tenant hit would show), user turns of --user-tokens tokens and answers
of --answer-tokens tokens. Turns go round-robin over the tenants, one request at a
time, so between two turns of a tenant every other tenant runs one: with a device
pool of 1/--pool-fraction of the working set, a tenant's previous turn is evicted
from the pool by then.

Each configuration serves the same workload on a fresh engine (the bundled SmolLM2
on the CPU unless --model): the device pool alone, then with a host tier (L2) as
large as the whole working set. Prints the prefix hit rate (cached prompt tokens
over prompt tokens), TTFT p50/p95, and the requests whose cached tokens exceed what
their own tenant's history allows (cross-tenant hits: must be 0). The last line is
JSON.

    python bench/kv_tiers.py --scale 0.5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import dataclass

from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Result:
    """One configuration's figures."""

    name: str
    hit_rate: float
    ttft_p50: float
    ttft_p95: float
    ttft_mean: float
    requests: int
    cross_tenant_hits: int
    l2_loads: int
    l2_write_backs: int
    l2_recomputed_instead: int


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def own_bound(previous: list[int] | None, prompt: list[int], block: int) -> int:
    """Tokens a cache may serve from the tenant's own previous turn: the block-aligned
    common prefix, never the prompt's last token."""
    if previous is None:
        return 0
    n = 0
    for a, b in zip(previous, prompt, strict=False):
        if a != b:
            break
        n += 1
    return min(n, len(prompt) - 1) // block * block


def working_set_tokens(args: argparse.Namespace) -> int:
    """Tokens of every conversation's full history (what an infinite cache holds)."""
    per_turn = args.user_tokens + args.answer_tokens
    return args.tenants * (args.system_tokens + args.turns * per_turn)


def run(args: argparse.Namespace, name: str, host_bytes: int) -> Result:
    """Serves the whole workload once on a fresh engine."""
    rng = random.Random(args.seed)
    pool_blocks = max(8, working_set_tokens(args) // args.pool_fraction // args.block_size)
    engine = LLMEngine.from_options(
        args.model,
        num_blocks=pool_blocks,
        block_size=args.block_size,
        kv_host_bytes=host_bytes,
        max_num_batched_tokens=4096,
    )
    vocab = list(range(300, 5000))
    systems = [
        [rng.choice(vocab) for _ in range(args.system_tokens)] for _ in range(args.tenants // 2 + 1)
    ]
    histories = [list(systems[t // 2]) for t in range(args.tenants)]
    previous: list[list[int] | None] = [None] * args.tenants
    params = SamplingParams(max_tokens=args.answer_tokens, temperature=0, ignore_eos=True)
    ttfts: list[float] = []
    cached = prompt_tokens = cross = 0
    for _turn in range(args.turns):
        for t in range(args.tenants):
            ids = histories[t] + [rng.choice(vocab) for _ in range(args.user_tokens)]
            sent = time.perf_counter()
            rid = engine.add_request(ids, params, cache_domain=f"t:{t}")
            first: float | None = None
            answer: list[int] = []
            hit = 0
            while engine.has_unfinished():
                for event in engine.step():
                    if event.request_id != rid:
                        continue
                    if first is None:
                        first = time.perf_counter() - sent
                        hit = event.num_cached_tokens
                    answer.extend(tok for d in event.deltas for tok in d.token_ids)
            assert first is not None
            ttfts.append(first)
            cached += hit
            prompt_tokens += len(ids)
            cross += hit > own_bound(previous[t], ids, args.block_size)
            previous[t] = ids + answer
            histories[t] = ids + answer
    stats = engine.stats()
    tier = stats.kv_tiers[0] if stats.kv_tiers else None
    return Result(
        name=name,
        hit_rate=cached / max(1, prompt_tokens),
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p95=percentile(ttfts, 0.95),
        ttft_mean=statistics.fmean(ttfts),
        requests=len(ttfts),
        cross_tenant_hits=cross,
        l2_loads=tier.loads if tier else 0,
        l2_write_backs=tier.write_backs if tier else 0,
        l2_recomputed_instead=tier.recomputed_instead if tier else 0,
    )


def main() -> None:
    """Parses options, runs both configurations, prints a table and a JSON line."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2)")
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies token counts")
    ap.add_argument("--pool-fraction", type=int, default=4, help="working set / device pool")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.system_tokens = int(args.system_tokens * args.scale)
    args.user_tokens = int(args.user_tokens * args.scale)
    # Bytes per token of SmolLM2-135M in fp32 (30 layers, 3 KV heads of 64): a host tier
    # twice the working set, so that it never has to evict.
    host_bytes = 2 * working_set_tokens(args) * 2 * 30 * 3 * 64 * 4
    results = [run(args, "device-only", 0), run(args, "device+L2", host_bytes)]
    print(f"{'config':12} {'hit rate':>8} {'p50 s':>8} {'p95 s':>8} {'cross':>6} {'loads':>6}")
    for r in results:
        print(
            f"{r.name:12} {r.hit_rate:8.3f} {r.ttft_p50:8.3f} {r.ttft_p95:8.3f} "
            f"{r.cross_tenant_hits:6d} {r.l2_loads:6d}"
        )
    base, tiered = results
    summary = {
        "configs": {r.name: r.__dict__ for r in results},
        "ttft_p50_ratio": tiered.ttft_p50 / max(1e-9, base.ttft_p50),
        "ttft_p95_ratio": tiered.ttft_p95 / max(1e-9, base.ttft_p95),
        "cross_tenant_hits": base.cross_tenant_hits + tiered.cross_tenant_hits,
        "working_set_tokens": working_set_tokens(args),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
