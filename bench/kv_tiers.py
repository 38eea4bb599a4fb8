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

The second workload (--workload short, issue 41's cost rule): --short-tenants tenants
(in pairs with the same prefix, as above), each sending --short-rounds requests of
the same short prefix (--short-prefix-blocks blocks: one or two) followed by
--short-user-tokens fresh tokens, round-robin, one request at a time, over a device
pool of 1/--pool-fraction of the prefixes' blocks (at least two prompts' blocks), so
a tenant's prefix is evicted before its next request. Such a hit saves little
prefill: the engine loads it from L2 only when its rule
(`engine/kv_cache/tier_cost.py`: measured copy bandwidth against measured prefill
seconds per token) predicts the load cheaper, else it recomputes and counts the
blocks as "recomputed instead". Device-only and +L2 run side by side in one
process, each request sent to both engines in turn (the order alternating), so that
the load of a shared machine falls on both alike. Prints TTFT p50/p95, hit rate, the
tier's blocks loaded and recomputed instead, the rule's estimates, the TTFT p50
ratio +L2/device-only (and, as checks, the median of each prompt's own ratio and
the p50 ratio of the first round, where nothing can hit, against the later rounds),
and a verdict: the rule holds when the p50 ratio is at most 1.05 (L2 must not be
slower; the 5% is the tolerance for timing noise on a shared CPU, one run of each
configuration; on a loaded machine TTFTs split between fast and stalled steps and the
p50 may land on either side of the gap: --threads 1 narrows it).

--workload long|short|both picks the workloads (default both); with long the output
is as above, with short the JSON line holds only the key "short", with both the long
workload's keys and "short".

    python bench/kv_tiers.py --scale 0.5
    python bench/kv_tiers.py --workload short --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.arg_types import at_least  # noqa: E402
from bench.nearest_rank import nearest_rank  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


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


def submit(
    engine: LLMEngine,
    ids: list[int],
    domain: str,
    params: SamplingParams,
    threads: int | None = None,
) -> tuple[float, int, list[int]]:
    """Serves one request alone on `engine`: (TTFT in seconds, cached prompt tokens,
    the answer's token ids). With `threads`, torch runs that many CPU threads."""
    if threads is not None and torch.get_num_threads() != threads:
        # numba's OpenMP pool (the CPU attention kernel) resets the count on its first
        # launch in the process, so --threads is set again before each request.
        torch.set_num_threads(threads)
    sent = time.perf_counter()
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(ids), params=params, cache_domain=domain)
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
    return first, hit, answer


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
            first, hit, answer = submit(engine, ids, f"t:{t}", params, args.threads)
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
        ttft_p50=nearest_rank(ttfts, 0.5),
        ttft_p95=nearest_rank(ttfts, 0.95),
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


# The cost rule's tolerance: +L2's TTFT p50 may exceed device-only's by this factor
# before it counts as slower (timing noise on a shared CPU, one run of each).
COST_RULE_TOLERANCE = 1.05
# Bytes per token of SmolLM2-135M in fp32 (30 layers, 3 KV heads of 64): host tiers are
# sized from it (for a smaller model, such as the tests' tiny one, they are just larger).
SMOLLM2_TOKEN_BYTES = 2 * 30 * 3 * 64 * 4


@dataclass
class ShortSide:
    """What one configuration of the short workload collected, request by request."""

    name: str
    engine: LLMEngine
    ttfts: list[float]
    cached: int = 0
    cross_tenant_hits: int = 0


def short_prompt_tokens(args: argparse.Namespace) -> int:
    """Tokens of one short-workload prompt: the shared prefix and the fresh part."""
    return args.short_prefix_blocks * args.block_size + args.short_user_tokens


def short_pool_blocks(args: argparse.Namespace) -> int:
    """Blocks of the short workload's device pool: 1/--pool-fraction of every tenant's
    prefix blocks, and at least two prompts' blocks (room for one request and more)."""
    prefixes = args.short_tenants * args.short_prefix_blocks
    per_prompt = -(-(short_prompt_tokens(args) + args.short_answer_tokens) // args.block_size)
    return max(8, 2 * per_prompt, prefixes // int(args.pool_fraction))


def cost_rule_figures(engine: LLMEngine, blocks: int) -> dict[str, float | None]:
    """The engine's measured load-or-recompute inputs, and its prediction for a hit of
    `blocks` blocks (None where the engine has no tier or has not measured yet)."""
    rule = getattr(engine, "tier_cost", None)
    if rule is None:
        return {}
    bandwidth, per_token = rule.estimates()
    load, recompute = rule.load_s(blocks), rule.recompute_s(blocks)
    return {
        "copy_bytes_per_s": bandwidth,
        "prefill_s_per_token": per_token,
        "predicted_load_ms": None if load is None else load * 1e3,
        "predicted_recompute_ms": None if recompute is None else recompute * 1e3,
    }


def short_result(args: argparse.Namespace, side: ShortSide, prompt_tokens: int) -> Result:
    """One side's figures, from its requests and its engine's tier counters."""
    stats = side.engine.stats()
    tier = stats.kv_tiers[0] if stats.kv_tiers else None
    prompts = max(1, prompt_tokens)
    l2_served = (tier.loads if tier else 0) * args.block_size
    return Result(
        name=side.name,
        hit_rate=side.cached / prompts,
        device_hit_rate=max(0, side.cached - l2_served) / prompts,
        l2_hit_rate=l2_served / prompts,
        ttft_p50=nearest_rank(side.ttfts, 0.5),
        ttft_p95=nearest_rank(side.ttfts, 0.95),
        ttft_mean=statistics.fmean(side.ttfts),
        requests=len(side.ttfts),
        cross_tenant_hits=side.cross_tenant_hits,
        l2_loads=tier.loads if tier else 0,
        l2_write_backs=tier.write_backs if tier else 0,
        l2_recomputed_instead=tier.recomputed_instead if tier else 0,
    )


def run_short(args: argparse.Namespace) -> dict[str, object]:
    """Serves the short-prefix workload on a device-only and a +L2 engine side by side,
    prints its table and verdict, and returns its JSON summary."""
    host_bytes = (
        2 * args.short_tenants * (short_prompt_tokens(args) + args.short_answer_tokens)
    ) * SMOLLM2_TOKEN_BYTES  # twice one prompt per tenant: the prefixes never leave L2
    sides: list[ShortSide] = []
    try:
        for name, host in (("device-only", 0), ("device+L2", host_bytes)):
            engine = LLMEngine.from_options(
                args.model,
                num_blocks=short_pool_blocks(args),
                block_size=args.block_size,
                kv_host_bytes=host,
                max_num_batched_tokens=4096,
            )
            sides.append(ShortSide(name, engine, []))
        rng = random.Random(args.seed)
        vocab = list(range(300, 5000))
        prefix_tokens = args.short_prefix_blocks * args.block_size
        prefixes = [
            [rng.choice(vocab) for _ in range(prefix_tokens)]
            for _ in range(args.short_tenants // 2 + 1)
        ]
        params = SamplingParams(max_tokens=args.short_answer_tokens, temperature=0, ignore_eos=True)
        previous: list[list[int] | None] = [None] * args.short_tenants
        prompt_tokens = 0
        for n in range(args.short_rounds * args.short_tenants):
            t = n % args.short_tenants
            ids = prefixes[t // 2] + [rng.choice(vocab) for _ in range(args.short_user_tokens)]
            bound = own_bound(previous[t], ids, args.block_size)
            answer: list[int] = []
            # Alternate which engine goes first, so that neither always runs right after
            # the other's request (caches warm, a neighbour's burst just over).
            for side in sides if n % 2 == 0 else sides[::-1]:
                first, hit, answer = submit(side.engine, ids, f"t:{t}", params, args.threads)
                side.ttfts.append(first)
                side.cached += hit
                side.cross_tenant_hits += hit > bound
            prompt_tokens += len(ids)
            previous[t] = ids + answer
        results = [short_result(args, side, prompt_tokens) for side in sides]
        rule = cost_rule_figures(sides[1].engine, args.short_prefix_blocks)
    finally:
        for side in sides:
            side.engine.close()
    base, tiered = results
    ratio = tiered.ttft_p50 / max(1e-9, base.ttft_p50)
    holds = ratio <= COST_RULE_TOLERANCE
    # The same prompt's two TTFTs, taken back to back: their ratio's median is blind to
    # the machine's load drifting over the run (a check on the p50 ratio, not the verdict).
    paired = statistics.median(
        b / max(1e-9, a) for a, b in zip(sides[0].ttfts, sides[1].ttfts, strict=True)
    )
    # The first round can hit nowhere (L2 only writes down), the later ones hit L2: the
    # split says whether a slower L2 comes from its write-backs or from its loads.
    first = args.short_tenants
    by_round = {
        part: nearest_rank(sides[1].ttfts[cut], 0.5)
        / max(1e-9, nearest_rank(sides[0].ttfts[cut], 0.5))
        for part, cut in (("first_round", slice(None, first)), ("later_rounds", slice(first, None)))
        if sides[0].ttfts[cut]
    }
    print(
        f"short prefixes: {args.short_tenants} tenants x {args.short_rounds} rounds, "
        f"prefix {args.short_prefix_blocks} block(s) of {args.block_size} + "
        f"{args.short_user_tokens} fresh tokens, device pool {short_pool_blocks(args)} blocks"
    )
    print(
        f"{'config':13} {'hit rate':>8} {'device':>7} {'L2':>6} {'p50 s':>8} {'p95 s':>8} "
        f"{'cross':>6} {'L2 ld':>6} {'recomp':>6}"
    )
    for r in results:
        print(
            f"{r.name:13} {r.hit_rate:8.3f} {r.device_hit_rate:7.3f} {r.l2_hit_rate:6.3f} "
            f"{r.ttft_p50:8.3f} {r.ttft_p95:8.3f} {r.cross_tenant_hits:6d} "
            f"{r.l2_loads:6d} {r.l2_recomputed_instead:6d}"
        )
    if rule:

        def ms(x: float | None) -> str:
            return "unmeasured" if x is None else f"{x:.3f} ms"

        print(
            f"cost rule, a hit of {args.short_prefix_blocks} block(s): load "
            f"{ms(rule['predicted_load_ms'])} against recompute "
            f"{ms(rule['predicted_recompute_ms'])}"
        )
    print(f"TTFT p50 device+L2/device-only: {ratio:.3f} (median of per-prompt ratios {paired:.3f})")
    print(
        "  by round: "
        + ", ".join(f"{part.replace('_', ' ')} {r:.3f}" for part, r in by_round.items())
    )
    print(
        f"cost rule (L2 not slower, p50 ratio <= {COST_RULE_TOLERANCE}): "
        + ("holds" if holds else f"does not hold: L2 is {100 * (ratio - 1):.1f}% slower")
    )
    return {
        "configs": {r.name: r.__dict__ for r in results},
        "ttft_p50_ratio": ratio,
        "ttft_p95_ratio": tiered.ttft_p95 / max(1e-9, base.ttft_p95),
        "paired_ttft_ratio_median": paired,
        "ttft_p50_ratio_by_round": by_round,
        "tolerance": COST_RULE_TOLERANCE,
        "cost_rule_holds": holds,
        "cost_rule": rule,
        "cross_tenant_hits": sum(r.cross_tenant_hits for r in results),
        "pool_blocks": short_pool_blocks(args),
        "threads": torch.get_num_threads(),
    }


def run_long(args: argparse.Namespace) -> dict[str, object]:
    """Serves the multi-turn workload in each configuration, prints its table and
    returns its JSON summary."""
    # A host tier twice the working set, so that it never has to evict.
    token_bytes = SMOLLM2_TOKEN_BYTES
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
    return summary


# An argparse type: a whole number of at least 1.
positive = at_least(1)


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Parses options, runs the chosen workloads, prints their tables and one JSON line
    (returned too)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2)")
    ap.add_argument(
        "--workload",
        choices=("long", "short", "both"),
        default="both",
        help="long: multi-turn over 4x the pool; short: short prefixes (the cost rule)",
    )
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
    ap.add_argument("--short-tenants", type=positive, default=64)
    ap.add_argument("--short-rounds", type=positive, default=4, help="requests per tenant")
    ap.add_argument(
        "--short-prefix-blocks", type=positive, default=1, help="blocks of the repeated prefix"
    )
    ap.add_argument("--short-user-tokens", type=positive, default=48, help="fresh tokens")
    ap.add_argument("--short-answer-tokens", type=positive, default=2)
    ap.add_argument(
        "--threads", type=positive, default=None, help="torch's CPU threads (default: torch's)"
    )
    args = ap.parse_args(argv)
    args.system_tokens = int(args.system_tokens * args.scale)
    args.user_tokens = int(args.user_tokens * args.scale)
    args.short_user_tokens = max(1, int(args.short_user_tokens * args.scale))
    threads = torch.get_num_threads()
    if args.threads is not None:
        # On a shared machine, 1 keeps a step from waiting on a thread that another
        # process holds up: TTFTs then split less between fast and stalled steps.
        torch.set_num_threads(args.threads)
    summary: dict[str, object] = {}
    try:
        if args.workload in ("long", "both"):
            summary.update(run_long(args))
        if args.workload in ("short", "both"):
            summary["short"] = run_short(args)
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (a test)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
