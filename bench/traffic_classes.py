"""Interactive and batch traffic on one engine (issue 42): what batch work costs the
interactive clients, and how much of the capacity they leave it puts to use.

The bundled SmolLM2 on the CPU with `cloister serve`'s engine options, driven step by
step in this process (no HTTP: what shows is the scheduler). Interactive clients keep
--concurrency requests in flight (a closed loop: each sends its next request as its
last one ends; random --prompt-tokens prompts, --new-tokens answers, greedy, EOS
ignored) for --seconds, in four phases:

1. interactive alone: TTFT and ITL p50, the reference;
2. batch alone: --batch-lines lines of the same shape, --batch-in-flight of them in
   the engine at a time: the engine's capacity C in output tokens/s;
3. both, the lines as batch work (`service_tier: "flex"`, traffic_class "batch");
4. both, the lines as ordinary requests: the peer, one class for all, as vLLM and
   SGLang schedule them (their `priority` does not preempt a running request).

Printed: the interactive TTFT and ITL p50 of phases 3 and 4 over phase 1 (goal: at
most 1.10 in phase 3), and the batch lines' output rate in phase 3 over the capacity
the interactive clients leave, C minus their own output rate in phase 3 (goal: at
least 0.6). Then the ceiling: the most batch output any schedule can get while
stretching the interactive steps by at most 10%, from the engine's measured cost of
a decode row and a prompt token. The last line is JSON.

    .venv/bin/python bench/traffic_classes.py --seconds 20
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from assembly.engine_options import serve_engine_options  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from server.settings import Settings  # noqa: E402

# The bound on what batch work may add to interactive inter-token time.
GOAL_ITL_STRETCH = 0.1


@dataclass
class Phase:
    """One phase's measurements."""

    name: str
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    interactive_tokens: int = 0
    batch_tokens: int = 0
    seconds: float = 0.0

    def p50(self, xs: list[float]) -> float | None:
        """The median, None without samples."""
        return statistics.median(xs) if xs else None

    def summary(self) -> dict[str, Any]:
        """The phase as plain data (ms and tokens/s)."""
        ttft, itl = self.p50(self.ttft_s), self.p50(self.itl_s)
        itl_mean = statistics.fmean(self.itl_s) if self.itl_s else None
        return {
            "ttft_p50_ms": None if ttft is None else round(ttft * 1000, 1),
            "itl_p50_ms": None if itl is None else round(itl * 1000, 1),
            # The mean too: a scheduler could keep the median and push the slack into
            # a few long gaps; this shows whether it did.
            "itl_mean_ms": None if itl_mean is None else round(itl_mean * 1000, 1),
            "interactive_tok_s": round(self.interactive_tokens / self.seconds, 1),
            "batch_tok_s": round(self.batch_tokens / self.seconds, 1),
            "requests": len(self.ttft_s),
        }


class Driver:
    """Runs one phase: the interactive clients and/or the batch lines, step by step."""

    def __init__(self, engine: LLMEngine, args: argparse.Namespace, seed: int) -> None:
        self.engine = engine
        self.args = args
        self.rng = random.Random(seed)
        self.params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
        self.sent: dict[str, tuple[bool, float]] = {}  # id -> (batch, time sent)
        self.last_token: dict[str, float] = {}

    def _send(self, *, batch: bool, traffic_class: str) -> None:
        prompt = tuple(self.rng.randrange(300, 5000) for _ in range(self.args.prompt_tokens))
        request = EngineRequest(
            prompt_token_ids=prompt,
            params=self.params,
            cache_domain="batch" if batch else f"user-{len(self.sent) % 4}",
            fairness_key="batch-tenant" if batch else "interactive-tenant",
            traffic_class=traffic_class,
        )
        self.sent[self.engine.add_request(request)] = (batch, time.perf_counter())

    def run(self, phase: Phase, *, interactive: bool, lines: int, line_class: str) -> Phase:
        """Steps the engine for --seconds (or until the lines are done, without clients)."""
        left = lines
        in_flight = {True: 0, False: 0}
        start = time.perf_counter()
        while True:
            now = time.perf_counter()
            if now - start >= self.args.seconds or (
                not interactive and not left and not in_flight[True]
            ):
                break
            while interactive and in_flight[False] < self.args.concurrency:
                self._send(batch=False, traffic_class="interactive")
                in_flight[False] += 1
            while left and in_flight[True] < self.args.batch_in_flight:
                self._send(batch=True, traffic_class=line_class)
                in_flight[True] += 1
                left -= 1
            for event in self.engine.step():
                batch, sent_at = self.sent[event.request_id]
                stamp = time.perf_counter()
                tokens = sum(len(d.token_ids) for d in event.deltas)
                if tokens:
                    if batch:
                        phase.batch_tokens += tokens
                    else:
                        phase.interactive_tokens += tokens
                        last = self.last_token.get(event.request_id)
                        if last is None:
                            phase.ttft_s.append(stamp - sent_at)
                        else:
                            phase.itl_s.append((stamp - last) / tokens)
                        self.last_token[event.request_id] = stamp
                if event.finished:
                    in_flight[batch] -= 1
        phase.seconds = time.perf_counter() - start
        for request_id in list(self.engine.requests):  # what the phase left unfinished
            self.engine.abort(request_id)
        while self.engine.has_unfinished():
            self.engine.step()
        return phase


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs the four phases, prints the table and then the JSON line; returns the report."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--batch-lines", type=int, default=500)
    # Lines in the engine at once (its queue holds 256); on a CPU the output rate falls
    # once a step carries a few dozen rows, so the capacity is measured at this depth.
    p.add_argument("--batch-in-flight", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = ("seconds", "concurrency", "batch_lines", "batch_in_flight", "prompt_tokens")
    for name in (*names, "new_tokens"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    options = serve_engine_options(Settings(device="cpu"))
    engine = LLMEngine.from_options(None, **options)
    driver = Driver(engine, args, args.seed)
    driver.run(Phase("warm-up"), interactive=True, lines=0, line_class="batch")
    phases = {
        "interactive alone": driver.run(
            Phase("interactive alone"), interactive=True, lines=0, line_class="batch"
        ),
        "batch alone": driver.run(
            Phase("batch alone"), interactive=False, lines=args.batch_lines, line_class="batch"
        ),
        "both, lines as batch (flex)": driver.run(
            Phase("flex"), interactive=True, lines=args.batch_lines, line_class="batch"
        ),
        "both, one class (peer)": driver.run(
            Phase("one class"),
            interactive=True,
            lines=args.batch_lines,
            line_class="interactive",
        ),  # fmt: skip
    }
    alone, capacity = phases["interactive alone"].summary(), phases["batch alone"].summary()
    report: dict[str, Any] = {"phases": {k: v.summary() for k, v in phases.items()}}
    head = f"{'phase':32} {'TTFT p50':>9} {'ITL p50':>8} {'ITL mean':>8}"
    print(f"{head} {'inter tok/s':>11} {'batch tok/s':>11}")
    for name, phase in phases.items():
        s = phase.summary()
        print(
            f"{name:32} {s['ttft_p50_ms'] or '-':>9} {s['itl_p50_ms'] or '-':>8} "
            f"{s['itl_mean_ms'] or '-':>8} {s['interactive_tok_s']:>11} {s['batch_tok_s']:>11}"
        )
    for key, label in (("both, lines as batch (flex)", "flex"), ("both, one class (peer)", "peer")):
        s = phases[key].summary()
        report[label] = {
            "ttft_ratio": _ratio(s["ttft_p50_ms"], alone["ttft_p50_ms"]),
            "itl_ratio": _ratio(s["itl_p50_ms"], alone["itl_p50_ms"]),
            "batch_share_of_left": round(
                s["batch_tok_s"] / max(capacity["batch_tok_s"] - s["interactive_tok_s"], 1e-9), 3
            ),
        }
        print(
            f"{label}: interactive TTFT x{report[label]['ttft_ratio']}, "
            f"ITL x{report[label]['itl_ratio']} of alone; batch uses "
            f"{report[label]['batch_share_of_left']:.0%} of the capacity left"
        )
    flex = report["flex"]
    report["ceiling"] = _ceiling(engine, args, capacity, phases["both, lines as batch (flex)"])
    if report["ceiling"] is not None:
        c = report["ceiling"]
        print(
            f"ceiling: a batch line's output token costs {c['ms_per_batch_token']} ms of "
            f"step time on this machine, so batch work that stretches interactive steps "
            f"by at most {GOAL_ITL_STRETCH:.0%} reaches at most {c['batch_tok_s']} tok/s, "
            f"{c['share_of_left']:.0%} of the capacity left"
        )
    within = [flex["ttft_ratio"], flex["itl_ratio"]]
    report["goals_met"] = {
        # A phase too short for a second token has no ITL: no ratio, so not met.
        "interactive_within_10pct": all(r is not None and r <= 1.1 for r in within),
        "batch_60pct_of_left": flex["batch_share_of_left"] >= 0.6,
    }
    print(json.dumps(report))
    return report


def _ceiling(
    engine: LLMEngine, args: argparse.Namespace, capacity: dict[str, Any], flex: Phase
) -> dict[str, Any] | None:
    """The most batch output a scheduler can get beside the interactive clients while
    stretching their steps by at most GOAL_ITL_STRETCH on average: from the engine's own
    measured cost of one more decode row and of a prompt token (a line's prompt is paid
    once over its --new-tokens). When every row costs compute, as on a CPU, this is far
    below the capacity left; on a GPU a few more rows cost next to nothing."""
    costs = engine.scheduler.step_budget.marginal_costs()
    if costs is None:
        return None
    row_s, token_s = costs
    per_batch_token = row_s + token_s * args.prompt_tokens / args.new_tokens
    if per_batch_token <= 0:
        return None
    # Of each second, the stretched steps spend stretch / (1 + stretch) on batch work.
    rate = GOAL_ITL_STRETCH / (1 + GOAL_ITL_STRETCH) / per_batch_token
    left = capacity["batch_tok_s"] - flex.summary()["interactive_tok_s"]
    return {
        "ms_per_batch_token": round(per_batch_token * 1000, 2),
        "batch_tok_s": round(rate, 1),
        "share_of_left": round(rate / max(left, 1e-9), 3),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, rounded; None when either phase had no sample of it."""
    if value is None or not reference:
        return None
    return round(value / reference, 3)


if __name__ == "__main__":
    main()
