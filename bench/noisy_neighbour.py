"""Noisy neighbour: one tenant's latency and cache under another's attacks, before and after.

Two live `cloister serve` run in turn on the same machine, both with the server's
defaults, SmolLM2-135M on the CPU (one torch and numba thread, as the issue measured
on one core: tests/reliability/noisy_server.py says why) and a KV
pool of `--pool-blocks` blocks (SmolLM2 keeps 46,080 bytes of KV per token in fp32):

- before: CLOISTER_KV_SHARES=false CLOISTER_FAIR_CACHED_SHARE=0 (the tenant-blind
  scheduler, newest sequence preempted, no default eviction floor);
- after: the defaults (weighted KV shares in the running set, fair_cached_share 0.2).

On each, a victim tenant streams one fixed greedy chat completion (24 tokens), one
request after another, alone, beside a well-behaved neighbour (two short requests at a
time), and under four attacks (tests/reliability/noisy.py): fill and squeeze (as many
long generations as the attacker's concurrency limit allows), KV flood (long prompts
with max_tokens 1), both at once, and grammars slow to mask (ambiguous Lark grammars,
each one new; no setting brings back masks made on the step, so both sides have
them off it). The table gives the victim's TTFT p50, ITL p50
and end-to-end p50 per scenario, their ratios against alone and against the fair
neighbour, its cached tokens after the flood and its preemptions (the operators'
`cloister_tenant_preemptions_suffered_total`; "-" where the server has no such
series). The goals (the issue's): under each attack the victim's TTFT p50 and ITL p50
within 1.5x of the fair-neighbour case, no victim preemption, its cached prefix alive
after the flood, and no attacker reply a 5xx or an error not in OpenAI's format.

    .venv/bin/python bench/noisy_neighbour.py [--requests 7] [--pool-blocks 64]
        [--sides before,after] [--attacker-concurrency 8] [--threads 1]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The platform's packages ahead of this folder: run as a script, bench/ comes first on
# the path, and its engine_hop.py (a benchmark) would shadow the engine_hop package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from bench.arg_types import at_least, positive_float  # noqa: E402
from tests.reliability.noisy import ATTACKS, SCENARIOS, Scenario, Workload, ratios  # noqa: E402
from tests.reliability.noisy_server import (  # noqa: E402
    OLD_BEHAVIOUR,
    SMOLLM2_KV_BYTES_PER_TOKEN,
    SMOLLM2_NAME,
    Plan,
    noisy_server,
)

SIDES = ("before", "after")
GOAL_RATIO = 1.5


def sides(text: str) -> tuple[str, ...]:
    """An argparse type: a comma-separated subset of before,after (in that order)."""
    named = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(named) - set(SIDES))
    if not named or unknown:
        raise argparse.ArgumentTypeError(
            f"sides are before and/or after, comma-separated (got {text!r})"
        )
    return tuple(s for s in SIDES if s in named)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Plan]:
    """The arguments and the plan they make; a bad one exits with argparse's usage error."""
    p = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--requests", type=at_least(1), default=7, help="victim requests a scenario")
    p.add_argument("--victim-tokens", type=at_least(1), default=24, help="its max_tokens")
    p.add_argument("--pool-blocks", type=at_least(4), default=64, help="KV pool, in blocks")
    p.add_argument("--block-size", type=at_least(1), default=16)
    p.add_argument(
        "--attacker-concurrency",
        type=at_least(3),
        default=8,
        help="the attacker's max_concurrent limit (2 of it go to the flood in 'both')",
    )
    p.add_argument("--attack-prompt-tokens", type=at_least(1), default=96)
    p.add_argument("--flood-prompt-tokens", type=at_least(1), default=256)
    p.add_argument("--request-timeout-s", type=positive_float, default=30.0)
    p.add_argument("--scenario-budget-s", type=positive_float, default=90.0)
    p.add_argument("--idle-cap-s", type=positive_float, default=15.0)
    p.add_argument("--sides", type=sides, default=SIDES, help="before,after (default both)")
    p.add_argument(
        "--threads", type=at_least(1), default=1, help="the servers' torch and numba threads"
    )
    p.add_argument("--model", type=Path, help="a model folder or GGUF (default: SmolLM2)")
    p.add_argument("--model-name", default=SMOLLM2_NAME)
    p.add_argument(
        "--kv-bytes-per-token",
        type=at_least(1),
        default=SMOLLM2_KV_BYTES_PER_TOKEN,
        help="the model's KV bytes per token, to size the pool (default: SmolLM2's, fp32)",
    )
    p.add_argument("--logs", type=Path, help="keep the servers' logs here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        plan = Plan(
            victim_requests=args.requests,
            victim_max_tokens=args.victim_tokens,
            pool_blocks=args.pool_blocks,
            block_size=args.block_size,
            kv_bytes_per_token=args.kv_bytes_per_token,
            attacker_concurrency=args.attacker_concurrency,
            attack_prompt_tokens=args.attack_prompt_tokens,
            flood_prompt_tokens=args.flood_prompt_tokens,
            request_timeout_s=args.request_timeout_s,
            scenario_budget_s=args.scenario_budget_s,
            idle_cap_s=args.idle_cap_s,
        )
    except ValueError as exc:
        p.error(str(exc))
    return args, plan


def goals(scenarios: Mapping[str, Scenario]) -> dict[str, dict[str, bool | None]]:
    """Each attack's goals, met or not (None: not measured on this server)."""
    fair = scenarios["fair"].figures()
    out: dict[str, dict[str, bool | None]] = {}
    for name in ATTACKS:
        f = scenarios[name].figures()
        within = {
            key: f[key] is not None
            and fair[key] is not None
            and f["complete"] == f["requests"]
            and f[key] <= GOAL_RATIO * fair[key]
            for key in ("ttft_p50_ms", "itl_p50_ms")
        }
        preempted = f["victim_preemptions"]
        out[name] = {
            "ttft_within_1_5x_fair": within["ttft_p50_ms"],
            "itl_within_1_5x_fair": within["itl_p50_ms"],
            "no_victim_preemption": None if preempted is None else preempted == 0,
            "cache_survives": (
                bool(f["cached_after_flood"]) and all(f["cached_tokens"])
                if name in ("flood", "both")
                else None
            ),
            "attacker_replies_clean": not scenarios[name].attacker_problems(),
        }
    return out


def _fmt(value: Any, spec: str = ".0f") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def table(report: Mapping[str, Any]) -> list[str]:
    """The human-readable table of every side and scenario."""
    lines = [
        f"{'side':7s} {'scenario':9s} {'TTFT p50':>9s} {'ITL p50':>8s} {'e2e p50':>8s}"
        f" {'vs alone TTFT/ITL/e2e':>22s} {'vs fair TTFT/ITL/e2e':>21s}"
        f" {'cached':>7s} {'preempt':>7s} {'done':>5s}"
    ]
    for side, data in report["sides"].items():
        for name in SCENARIOS:
            f = data["scenarios"][name]
            alone = data["vs_alone"].get(name)
            fair = data["vs_fair"].get(name)

            def trio(r: Mapping[str, Any] | None) -> str:
                if r is None:
                    return "-"
                return "/".join(_fmt(r[k], ".2f") for k in ("ttft_p50", "itl_p50", "e2e_p50"))

            cached = f["cached_after_flood"] if name in ("flood", "both") else None
            lines.append(
                f"{side:7s} {name:9s} {_fmt(f['ttft_p50_ms']) + ' ms':>9s}"
                f" {_fmt(f['itl_p50_ms']) + ' ms':>8s} {_fmt(f['e2e_p50_ms']) + ' ms':>8s}"
                f" {trio(alone):>22s} {trio(fair):>21s}"
                f" {_fmt(cached, 'd'):>7s} {_fmt(f['victim_preemptions'], '.0f'):>7s}"
                f" {f['complete']:>2d}/{f['requests']:<2d}"
            )
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs every scenario on each side's server; prints the table, then the JSON line."""
    args, plan = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="noisy-neighbour-"))
    # One warm-up request, the timed ones of each scenario and of the fair one again, and
    # two after-flood checks.
    per_side = 1 + plan.victim_requests * (len(SCENARIOS) + 1) + 2
    from tqdm import tqdm

    bar = tqdm(
        total=per_side * len(args.sides),
        unit="req",
        desc="victim requests",
        file=sys.stderr,
        disable=args.no_progress,
    )
    report: dict[str, Any] = {
        "plan": {
            "victim_requests": plan.victim_requests,
            "victim_max_tokens": plan.victim_max_tokens,
            "pool_blocks": plan.pool_blocks,
            "pool_tokens": plan.pool_tokens,
            "kv_cache_bytes": plan.kv_cache_bytes,
            "attacker_concurrency": plan.attacker_concurrency,
            "attack_prompt_tokens": plan.attack_prompt_tokens,
            "long_max_tokens": plan.long_max_tokens,
            "flood_prompt_tokens": plan.flood_prompt_tokens,
            "flood_loops": plan.flood_loops,
            "neighbour_loops": plan.neighbour_loops,
            "grammar_loops": plan.grammar_loops,
        },
        "model": args.model_name,
        "threads": args.threads,
        "cores": os.cpu_count(),
        "sides": {},
    }
    started = time.monotonic()
    try:
        for side in args.sides:
            root = work / side
            root.mkdir(parents=True)
            bar.set_description(f"{side}: victim requests")
            try:
                with noisy_server(
                    root,
                    plan,
                    old=side == "before",
                    model=args.model,
                    model_name=args.model_name,
                    threads=args.threads,
                ) as server:
                    scenarios = Workload(server, progress=bar.update).run_all()
            finally:
                if args.logs is not None:
                    args.logs.mkdir(parents=True, exist_ok=True)
                    if (root / "server.log").exists():
                        shutil.copy(root / "server.log", args.logs / f"{side}.log")
            figures = {name: s.figures() for name, s in scenarios.items()}
            met = goals(scenarios)
            report["sides"][side] = {
                # "before" sets these; "after" leaves the server its defaults.
                "settings": {f"CLOISTER_{k.upper()}": v for k, v in OLD_BEHAVIOUR.items()}
                if side == "before"
                else "defaults",
                "scenarios": figures,
                "vs_alone": ratios(figures, "alone"),
                "vs_fair": ratios(figures, "fair"),
                "goals": met,
                "meets_goals": all(v is not False for g in met.values() for v in g.values()),
                "attacker_problems": [
                    p for name in ATTACKS for p in scenarios[name].attacker_problems()
                ][:10],
            }
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    report["duration_s"] = round(time.monotonic() - started, 1)
    for line in table(report):
        print(line)
    for side, data in report["sides"].items():
        failed = [
            f"{a}:{g}" for a, gs in data["goals"].items() for g, ok in gs.items() if ok is False
        ]
        print(f"{side}: goals {'met' if data['meets_goals'] else 'missed: ' + ', '.join(failed)}")
    print(json.dumps(report, sort_keys=True))
    return report


if __name__ == "__main__":
    main()
