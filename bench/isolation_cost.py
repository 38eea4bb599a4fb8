"""Isolation cost: TTFT of per-tenant cache isolation against one shared (unsafe) domain.

Workload (seeded, identical for every configuration): --tenants tenants share one
--system-tokens system prompt; each runs --conversations private chats of --turns
turns (turn k's prompt is the chat template over the system prompt, every earlier
user and assistant message, and the new user message). Requests arrive as one
Poisson process (--rate per second); a turn whose previous answer has not come
back yet is sent when it does. Greedy, --max-tokens answer tokens, so TTFT dominates.

Three configurations, each on a fresh engine over the same loaded weights:

    shared     one cache domain for everyone: what a single-domain server does (unsafe)
    isolated   one cache domain per tenant: vLLM's per-salt design, the system prompt
               is recomputed once per tenant
    published  one domain per tenant, the system message's token ids published
               (`CacheConfig.published_prefixes`): its full blocks are shared

They run --repeats times in a mirrored order (ABC CBA ...) so slow drift on a busy
machine falls on all of them alike. Prints TTFT p50/p95 (pooled over rounds), hit rate
(cached / prompt tokens) and throughput per configuration; the ratios isolated/shared
and published/shared (the geometric mean of each round's ratio, which cancels a steady
drift in speed; the pooled ratio beside it), and as the last line one JSON object (goal:
published/shared TTFT p50 < 1.05). On a shared, busy CPU, --threads 1 steadies it.

    python bench/isolation_cost.py            # the default run, under 10 minutes on 2 cores
    python bench/isolation_cost.py --quick --model <tiny model dir>
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import pathlib
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.isolation_workload import (  # noqa: E402
    Turn,
    Workload,
    build_workload,
    replay_hits,
)
from engine.engine_builder import build_config  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model.loader import LoadedModel, load_model  # noqa: E402
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams  # noqa: E402

CONFIGS = ("shared", "isolated", "published")
GOAL_RATIO = 1.05
WARM_UP_TOKENS = 256


@dataclass(frozen=True)
class Record:
    """What one request measured in one run."""

    index: int
    tenant: int
    turn: int
    submitted: int  # the order the engine received it in
    prompt_tokens: int
    cached_tokens: int
    sent_s: float  # actual send time, from the start of the run
    ttft_s: float
    held: bool  # sent late because the previous turn's answer had not come back


@dataclass(frozen=True)
class RunResult:
    """One configuration's run: its records and its wall time."""

    config: str
    repeat: int
    records: tuple[Record, ...]
    wall_s: float
    output_tokens: int
    errors: int


def percentile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of a non-empty list."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# -- the workload -----------------------------------------------------------------------


# -- one run ----------------------------------------------------------------------------


def domain_of(config: str, tenant: int) -> str:
    """The cache domain a tenant's requests use under `config`."""
    return "t:shared" if config == "shared" else f"t:{tenant}"


def warm_up(engine: LLMEngine, length: int, max_tokens: int) -> None:
    """One prefill and decode in a domain of its own, so kernels and allocators are warm."""
    rng = random.Random(12345)
    ids = [rng.randrange(300, 5000) for _ in range(length)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(
        EngineRequest(prompt_token_ids=tuple(ids), params=params, cache_domain="bench:warmup")
    )
    while engine.has_unfinished():
        engine.step()


def run_config(
    loaded: LoadedModel,
    options: dict[str, Any],
    workload: Workload,
    config: str,
    repeat: int,
    max_tokens: int,
    progress: Callable[[], None],
) -> RunResult:
    """Serves the whole workload once on a fresh engine; returns what each request saw."""
    published = (workload.published_ids,) if config == "published" else ()
    engine = LLMEngine(build_config(None, published_prefixes=published, **options), loaded)
    warm_up(engine, WARM_UP_TOKENS, max_tokens)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    turns = workload.turns
    pending = list(turns)  # in arrival order
    done: dict[int, float] = {}  # finished turns -> when, from the start of the run
    live: dict[str, tuple[Turn, float, bool, int]] = {}
    submitted = 0
    records: dict[int, Record] = {}
    output_tokens = errors = 0
    t0 = time.perf_counter()
    while pending or live:
        now = time.perf_counter() - t0
        held_back: list[Turn] = []
        for t in pending:
            if t.arrival_s > now:
                held_back.append(t)
            elif t.previous is not None and t.previous not in done:
                held_back.append(t)  # the user has not read the last answer yet
            else:
                sent = t.arrival_s if t.previous is None else max(t.arrival_s, done[t.previous])
                rid = engine.add_request(
                    EngineRequest(
                        prompt_token_ids=tuple(list(t.prompt_ids)),
                        params=params,
                        request_id=f"r{t.index}",
                        cache_domain=domain_of(config, t.tenant),
                    ),
                    arrival_time=time.time() - (now - sent),
                )
                live[rid] = (t, sent, sent > t.arrival_s + 1e-3, submitted)
                submitted += 1
        pending = held_back
        if not engine.has_unfinished():
            due = [t.arrival_s for t in pending if t.previous is None or t.previous in done]
            if due:
                time.sleep(max(0.0, min(0.01, min(due) - now)))
            continue
        for event in engine.step():
            t, sent, held, seq = live[event.request_id]
            output_tokens += sum(len(d.token_ids) for d in event.deltas)
            if t.index not in records and any(d.token_ids for d in event.deltas):
                records[t.index] = Record(
                    t.index,
                    t.tenant,
                    t.turn,
                    seq,
                    len(t.prompt_ids),
                    event.num_cached_tokens,
                    sent,
                    time.perf_counter() - t0 - sent,
                    held,
                )
                progress()
            if event.finished:
                done[t.index] = time.perf_counter() - t0
                del live[event.request_id]
        # A failed or refused request has no record; its conversation goes on without it.
        for rid, _ in engine.take_failures() + engine.take_refused():
            errors += 1
            done[live.pop(rid)[0].index] = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    del engine
    gc.collect()
    ordered = tuple(records[i] for i in sorted(records))
    return RunResult(config, repeat, ordered, wall, output_tokens, errors)


# -- figures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """One configuration's figures over all its repeats."""

    config: str
    requests: int
    expected_requests: int
    errors: int
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_mean_s: float
    ttft_p50_by_repeat_s: tuple[float, ...]
    ttft_p95_by_repeat_s: tuple[float, ...]
    hit_rate: float
    replay_hit_rate: float
    prompt_tokens: int
    cached_tokens: int
    held_requests: int
    throughput_tok_s: float
    wall_s: float


def summarize(config: str, runs: list[RunResult], workload: Workload, block_size: int) -> Summary:
    """Pools one configuration's repeats into its figures."""
    ttfts = [r.ttft_s for run in runs for r in run.records]
    prompt = sum(r.prompt_tokens for run in runs for r in run.records)
    cached = sum(r.cached_tokens for run in runs for r in run.records)
    replay = replay_hits(workload, config, block_size)
    total_prompt = sum(len(t.prompt_ids) for t in workload.turns)
    wall = sum(run.wall_s for run in runs)
    return Summary(
        config=config,
        requests=sum(len(run.records) for run in runs),
        expected_requests=len(workload.turns) * len(runs),
        errors=sum(run.errors for run in runs),
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p95_s=percentile(ttfts, 0.95),
        ttft_mean_s=sum(ttfts) / len(ttfts),
        ttft_p50_by_repeat_s=tuple(
            percentile([r.ttft_s for r in run.records], 0.5) for run in runs
        ),
        ttft_p95_by_repeat_s=tuple(
            percentile([r.ttft_s for r in run.records], 0.95) for run in runs
        ),
        hit_rate=cached / max(1, prompt),
        replay_hit_rate=sum(replay) / max(1, total_prompt),
        prompt_tokens=prompt,
        cached_tokens=cached,
        held_requests=sum(r.held for run in runs for r in run.records),
        throughput_tok_s=sum(run.output_tokens for run in runs) / max(1e-9, wall),
        wall_s=wall,
    )


def kv_blocks_needed(workload: Workload, block_size: int, max_tokens: int) -> int:
    """A pool no run evicts from: every block any run can fill, counted as isolation does.

    Isolation caches the most (each tenant its own system prompt): its distinct prompt
    blocks, plus per request the blocks its answer can fill, plus the warm-up's.
    """
    bs = block_size
    distinct: set[tuple[int, int]] = set()
    for t in workload.turns:
        chain = 0
        for k in range(len(t.prompt_ids) // bs):
            chain = hash((chain, t.prompt_ids[k * bs : (k + 1) * bs]))
            distinct.add((t.tenant, chain))
    answers = len(workload.turns) * (max_tokens // bs + 2)
    return len(distinct) + answers + WARM_UP_TOKENS // bs + 2 + 16


def _seq(record: Record) -> int:
    return record.submitted


def round_ratio(mine: Sequence[float], base: Sequence[float]) -> float:
    """Geometric mean over rounds of mine[r] / base[r]."""
    logs = [math.log(max(1e-12, ratio(a, b))) for a, b in zip(mine, base, strict=True)]
    return math.exp(sum(logs) / len(logs))


def ratio(a: float, b: float) -> float:
    """a / b, safe for a zero b."""
    return a / b if b > 0 else float("inf")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The benchmark's flags; --quick shrinks the workload for a smoke test."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2)")
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=1800)
    ap.add_argument("--conversations", type=int, default=2, help="per tenant")
    ap.add_argument("--turns", type=int, default=2, help="per conversation")
    ap.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="mirrored rounds of the 3 configs")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--publish",
        choices=("system", "system+header"),
        default="system+header",
        help="publish the system message's ids, or those and the user turn's header",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: its default)")
    ap.add_argument("--details", action="store_true", help="per-request records in the JSON")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a small run for smoke tests: 4 tenants, 160-token system prompt, 2x2 turns, one round",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.tenants, args.system_tokens, args.conversations, args.turns = 4, 160, 2, 2
        args.rate, args.max_tokens, args.repeats = 4.0, 4, 1
    for name in ("tenants", "system_tokens", "conversations", "turns", "max_tokens", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.rate <= 0:
        ap.error("--rate must be positive")
    return args


def order_of(repeats: int) -> list[tuple[str, int]]:
    """ABC, CBA, ABC, ...: a mirrored order, so drift weighs on every configuration alike."""
    out: list[tuple[str, int]] = []
    for r in range(repeats):
        names = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        out.extend((n, r) for n in names)
    return out


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the three configurations, prints the table and the JSON line; returns the JSON."""
    args = parse_args(argv)
    started = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=torch.float32, device="cpu")
    workload = build_workload(
        loaded.tokenizer,
        tenants=args.tenants,
        system_tokens=args.system_tokens,
        conversations=args.conversations,
        turns=args.turns,
        rate=args.rate,
        seed=args.seed,
        publish=args.publish,
    )
    bs = args.block_size
    options: dict[str, Any] = {
        "block_size": bs,
        "num_blocks": kv_blocks_needed(workload, bs, args.max_tokens),
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "max_model_len": max(len(t.prompt_ids) for t in workload.turns) + args.max_tokens + bs,
        "prefix_cache": "hash",
        "seed": args.seed,
    }
    n = len(workload.turns)
    print(
        f"model {loaded.name}: {args.tenants} tenants, system message "
        f"{len(workload.system_ids)} tokens ({workload.system_content_tokens} of content, "
        f"{len(workload.published_ids)} published: {len(workload.published_ids) // bs} full "
        f"blocks), {n} requests per run, "
        f"prompts {min(len(t.prompt_ids) for t in workload.turns)}-"
        f"{max(len(t.prompt_ids) for t in workload.turns)} tokens, "
        f"{args.rate}/s Poisson over {workload.turns[-1].arrival_s:.1f}s",
        flush=True,
    )
    plan = order_of(args.repeats)
    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=n * len(plan), unit="req", desc="requests", file=sys.stderr)
    runs: dict[str, list[RunResult]] = {c: [] for c in CONFIGS}
    for config, repeat in plan:
        if bar is not None:
            bar.set_postfix_str(f"{config} #{repeat + 1}")
        result = run_config(
            loaded,
            options,
            workload,
            config,
            repeat,
            args.max_tokens,
            (lambda: bar.update(1)) if bar is not None else (lambda: None),
        )
        runs[config].append(result)
    if bar is not None:
        bar.close()
    sums = {c: summarize(c, runs[c], workload, bs) for c in CONFIGS}
    shared = sums["shared"]
    # The headline ratios: the geometric mean over rounds of each round's ratio. In the
    # mirrored order a machine that slows (or speeds up) by a steady factor per run
    # cancels out; the pooled ratios are kept beside them.
    ratios: dict[str, float] = {}
    for other in ("isolated", "published"):
        for q in ("p50", "p95"):
            mine = getattr(sums[other], f"ttft_{q}_by_repeat_s")
            base = getattr(shared, f"ttft_{q}_by_repeat_s")
            ratios[f"{other}_vs_shared_ttft_{q}_ratio"] = round_ratio(mine, base)
    pooled = {
        f"pooled_{other}_vs_shared_ttft_{q}_ratio": ratio(
            getattr(sums[other], f"ttft_{q}_s"), getattr(shared, f"ttft_{q}_s")
        )
        for other in ("isolated", "published")
        for q in ("p50", "p95")
    }
    print(
        f"\n{'config':10} {'reqs':>5} {'ttft p50':>9} {'p95':>8} {'mean':>8} "
        f"{'hit rate':>9} {'replay':>7} {'held':>5} {'tok/s':>7}"
    )
    for s in sums.values():
        print(
            f"{s.config:10} {s.requests:5d} {s.ttft_p50_s:9.3f} {s.ttft_p95_s:8.3f} "
            f"{s.ttft_mean_s:8.3f} {s.hit_rate:9.3f} {s.replay_hit_rate:7.3f} "
            f"{s.held_requests:5d} {s.throughput_tok_s:7.1f}"
        )
    for key, value in ratios.items():
        other, q = key.split("_")[0], key.split("_")[-2]
        rounds = ", ".join(
            f"{ratio(a, b):.3f}"
            for a, b in zip(
                getattr(sums[other], f"ttft_{q}_by_repeat_s"),
                getattr(shared, f"ttft_{q}_by_repeat_s"),
                strict=True,
            )
        )
        print(
            f"{key.removesuffix('_ratio').replace('_', ' ')}: {value:.3f} "
            f"(rounds {rounds}; pooled {pooled['pooled_' + key]:.3f})"
        )
    p50 = ratios["published_vs_shared_ttft_p50_ratio"]
    goal_met = p50 < GOAL_RATIO
    print(f"goal (published/shared TTFT p50 < {GOAL_RATIO}): {'met' if goal_met else 'NOT met'}")
    summary: dict[str, Any] = {
        "model": loaded.name,
        "workload": {
            "tenants": args.tenants,
            "system_tokens": workload.system_content_tokens,
            "system_message_tokens": len(workload.system_ids),
            "publish": args.publish,
            "published_tokens": len(workload.published_ids),
            "published_blocks": len(workload.published_ids) // bs,
            "block_size": bs,
            "conversations_per_tenant": args.conversations,
            "turns": args.turns,
            "requests_per_run": n,
            "rate_per_s": args.rate,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "seed": args.seed,
        },
        "configs": {c: asdict(s) for c, s in sums.items()},
        **ratios,
        **pooled,
        "goal_ratio": GOAL_RATIO,
        "goal_met": goal_met,
        "wall_s": time.perf_counter() - started,
    }
    if args.details:
        summary["records"] = {
            c: [asdict(r) for run in runs[c] for r in run.records] for c in CONFIGS
        }
        summary["replay_hits"] = {
            c: [
                replay_hits(workload, c, bs, [r.index for r in sorted(run.records, key=_seq)])
                for run in runs[c]
            ]
            for c in CONFIGS
        }
        summary["turns"] = [
            {"index": t.index, "tenant": t.tenant, "turn": t.turn, "previous": t.previous}
            for t in workload.turns
        ]
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
