"""KV tiers benchmark: multi-tenant multi-turn chat whose working set outgrows the pool.

Workload: --tenants tenants, each with one conversation of --turns turns over its own
--system-tokens system prompt (tenants come in pairs with the SAME system prompt, so
that a cross-tenant hit would show), user turns of --user-tokens tokens and answers
of --answer-tokens tokens. Turns go round-robin over the tenants, one request at a
time, so between two turns of a tenant every other tenant runs one: with a device
pool of 1/--pool-fraction of the working set, a tenant's previous turn is evicted
from the pool by then.

Each configuration serves the same workload on a fresh engine (the bundled SmolLM2
on the CPU unless --model): the device pool alone; with a host tier (L2) as large
as the whole working set; and with a host tier the size of the device pool over a
disk tier (L3, in a temporary directory) as large as the working set, so that most
tiered hits come from disk. (A disk tier with no host tier is not a configuration
the engine has: the disk tier needs the host tier, `host_setup.attach_disk_tier`.)
Prints the prefix hit rate (cached prompt tokens over prompt tokens) and, per tier,
the share of prompt tokens it served (device hits, host slots loaded, disk blocks
loaded), TTFT p50/p95, and the requests whose cached tokens exceed what their own
tenant's history allows (cross-tenant hits: must be 0). The last line is JSON.

    python bench/kv_tiers.py --scale 0.5
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
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
    # Shares of the prompt tokens served by each place (they add up to hit_rate): the
    # device pool's own hits, and the blocks each tier below loaded to the device.
    device_hit_rate: float = 0.0
    l2_hit_rate: float = 0.0
    l3_hit_rate: float = 0.0
    l3_loads: int = 0
    l3_write_backs: int = 0
    l3_recomputed_instead: int = 0


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
    return int(args.tenants * (args.system_tokens + args.turns * per_turn))


def pool_blocks(args: argparse.Namespace) -> int:
    """Blocks of the device pool: 1/--pool-fraction of the working set."""
    return max(8, working_set_tokens(args) // int(args.pool_fraction) // int(args.block_size))


def run(
    args: argparse.Namespace,
    name: str,
    host_bytes: int,
    disk_bytes: int = 0,
    disk_path: str | None = None,
) -> Result:
    """Serves the whole workload once on a fresh engine (closed at the end, so that its
    disk tier's writes finish and its directory's lock is released)."""
    engine = LLMEngine.from_options(
        args.model,
        num_blocks=pool_blocks(args),
        block_size=args.block_size,
        kv_host_bytes=host_bytes,
        kv_disk_path=disk_path,
        kv_disk_bytes=disk_bytes,
        max_num_batched_tokens=4096,
    )
    try:
        return serve(args, name, engine)
    finally:
        engine.close()


def serve(args: argparse.Namespace, name: str, engine: LLMEngine) -> Result:
    """Serves the workload on `engine` and takes its figures."""
    rng = random.Random(args.seed)
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
            rid = engine.add_request(
                EngineRequest(prompt_token_ids=tuple(ids), params=params, cache_domain=f"t:{t}")
            )
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
    disk = stats.kv_tiers[1] if len(stats.kv_tiers) > 1 else None
    prompts = max(1, prompt_tokens)
    l2_served = (tier.loads if tier else 0) * args.block_size
    l3_served = (disk.loads if disk else 0) * args.block_size
    return Result(
        name=name,
        hit_rate=cached / prompts,
        device_hit_rate=max(0, cached - l2_served - l3_served) / prompts,
        l2_hit_rate=l2_served / prompts,
        l3_hit_rate=l3_served / prompts,
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p95=percentile(ttfts, 0.95),
        ttft_mean=statistics.fmean(ttfts),
        requests=len(ttfts),
        cross_tenant_hits=cross,
        l2_loads=tier.loads if tier else 0,
        l2_write_backs=tier.write_backs if tier else 0,
        l2_recomputed_instead=tier.recomputed_instead if tier else 0,
        l3_loads=disk.loads if disk else 0,
        l3_write_backs=disk.write_backs if disk else 0,
        l3_recomputed_instead=disk.recomputed_instead if disk else 0,
    )


def main() -> None:
    """Parses options, runs the configurations, prints a table and a JSON line."""
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
    ap.add_argument("--no-l3", action="store_true", help="skip the disk tier configuration")
    args = ap.parse_args()
    args.system_tokens = int(args.system_tokens * args.scale)
    args.user_tokens = int(args.user_tokens * args.scale)
    # Bytes per token of SmolLM2-135M in fp32 (30 layers, 3 KV heads of 64): a host tier
    # twice the working set, so that it never has to evict.
    token_bytes = 2 * 30 * 3 * 64 * 4
    host_bytes = 2 * working_set_tokens(args) * token_bytes
    results = [run(args, "device-only", 0), run(args, "device+L2", host_bytes)]
    if not args.no_l3:
        # A host tier the size of the device pool, over a disk tier that never has to
        # evict: 2.5 working sets' bytes (a file adds a header and the block's token ids).
        small_host = pool_blocks(args) * args.block_size * token_bytes
        disk_bytes = host_bytes * 5 // 4
        with tempfile.TemporaryDirectory(prefix="kv-tiers-l3-") as path:
            results.append(run(args, "device+L2+L3", small_host, disk_bytes, path))
    print(
        f"{'config':13} {'hit rate':>8} {'device':>7} {'L2':>6} {'L3':>6} {'p50 s':>8} "
        f"{'p95 s':>8} {'cross':>6} {'L2 ld':>6} {'L3 ld':>6}"
    )
    for r in results:
        print(
            f"{r.name:13} {r.hit_rate:8.3f} {r.device_hit_rate:7.3f} {r.l2_hit_rate:6.3f} "
            f"{r.l3_hit_rate:6.3f} {r.ttft_p50:8.3f} {r.ttft_p95:8.3f} "
            f"{r.cross_tenant_hits:6d} {r.l2_loads:6d} {r.l3_loads:6d}"
        )
    base, tiered = results[0], results[1]
    summary: dict[str, object] = {
        "configs": {r.name: r.__dict__ for r in results},
        "ttft_p50_ratio": tiered.ttft_p50 / max(1e-9, base.ttft_p50),
        "ttft_p95_ratio": tiered.ttft_p95 / max(1e-9, base.ttft_p95),
        "cross_tenant_hits": sum(r.cross_tenant_hits for r in results),
        "working_set_tokens": working_set_tokens(args),
    }
    if len(results) > 2:
        summary["l3_ttft_p50_ratio"] = results[2].ttft_p50 / max(1e-9, base.ttft_p50)
        summary["l3_ttft_p95_ratio"] = results[2].ttft_p95 / max(1e-9, base.ttft_p95)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
