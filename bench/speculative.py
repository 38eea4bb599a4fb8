"""Speculative decoding (issue 40): n-gram drafts against the same engine without them.

The bundled SmolLM2 on the CPU with `cloister serve`'s engine options, driven step by
step in this process (no HTTP: what shows is the engine). Two engines are built from
the same settings: the peer without speculation and one with
`speculative_method=ngram` (--k draft tokens at most). Two workloads, greedy
(temperature 0), through the model's chat template:

- grounded: "repeat this text, changing one name" over a --text-tokens text (about 500
  tokens), so that the answer largely copies the prompt and n-gram lookup finds drafts;
- open: open-ended chat prompts, where the answer has little to look up.

Each workload runs at each --concurrency (a closed loop: that many requests in flight,
the next sent as one ends; --requests per slot, so concurrency x --requests requests a
level: with a single wave, the level would measure its slowest request, the batch
shrinking as the others end, rather than tokens/s at that concurrency),
peer and speculation alternating --rounds times (the order flips every round, so that a
drift of the machine falls on both). Printed per workload and concurrency: output
tokens/s, ITL p50/p95 (ms per token: a step that emits several tokens counts each at
its share of the gap), the acceptance rate and mean accepted length (tokens a verify
row emits), the share of requests whose greedy output is the peer's, and the tokens/s
ratio over the peer. Goals: at least 1.6x on grounded at concurrency 1, 0.97x on open
at concurrency 1, and 1.0x at the highest concurrency on both. The last line is JSON
(also written to --json-out).

    .venv/bin/python bench/speculative.py --json-out var/bench/speculative.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from assembly.engine_options import serve_engine_options  # noqa: E402
from bench.nearest_rank import nearest_rank  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from server.settings import Settings  # noqa: E402

# The grounded texts are drawn from these sentences (a made-up town report: plain prose
# the model copies well, with names and numbers that it cannot guess).
SENTENCES = (
    "The committee met on Tuesday evening in the library of Harwick to review the water "
    "report for the past year.",
    "Mrs. Okafor opened the meeting by thanking the volunteers who had checked the old "
    "pipes along Mill Street.",
    "The report found that the northern reservoir lost about four percent of its water to "
    "leaks between March and October.",
    "Repairs to the pumping station cost 18,400 pounds, which was less than the committee "
    "had set aside in January.",
    "Mr. Lindqvist asked whether the new meters on Cedar Lane had been read by hand or "
    "sent their figures by radio.",
    "The engineer explained that most of the meters now report by radio every night, but "
    "twelve houses still need a visit.",
    "Several residents had written to complain about brown water after the main on Bridge "
    "Road was flushed in August.",
    "The committee agreed to send a letter to every household on Bridge Road explaining "
    "the flushing and its timetable.",
    "A study of the southern wells showed that the water table rose by nearly a metre "
    "after the wet spring.",
    "The school on Fenwick Hill asked for a drinking fountain in the playground, and the "
    "committee approved the cost.",
    "Dr. Ashworth presented the results of the monthly tests, none of which found bacteria "
    "above the legal limit.",
    "She noted that the chlorine levels at the far end of the network were lower than at "
    "the treatment works.",
    "The committee asked the engineer to add a second dosing point near the Orchard Road "
    "junction before winter.",
    "A proposal to replace the lead pipes in the old town centre was discussed at length "
    "but not yet decided.",
    "The treasurer said that the replacement would cost more than the reserve fund could "
    "cover in a single year.",
    "It was suggested that the work be done in three stages, starting with the streets "
    "around the market square.",
    "Mrs. Patel reported that the rainwater tanks given to forty households last spring "
    "had been well received.",
    "Most of the households said that they used the tanks to water their gardens and wash "
    "their cars in summer.",
    "The committee thanked the staff of the treatment works for keeping the supply running "
    "during the storm in November.",
    "The next meeting will be held on the first Tuesday of March in the same room of the "
    "library at seven o'clock.",
)
OPEN_PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain to a ten-year-old why the sky is blue.",
    "What are some good habits for staying healthy while working from home?",
    "Describe your ideal weekend in a few paragraphs.",
    "Give me three ideas for a birthday party for a friend who loves astronomy.",
    "Why do cats like to sit in boxes? Give a few possible reasons.",
    "Write a poem about autumn leaves falling in a quiet park.",
    "How would you explain the internet to someone from the year 1800?",
    "Suggest a plan for learning to play the guitar in three months.",
    "What makes a good teacher? Describe the qualities you think matter most.",
    "Invent a new board game and explain its rules.",
    "Write a letter to your future self, ten years from now.",
    "Describe a busy market in a city you imagine.",
    "What are the pros and cons of living in a small village?",
    "Tell me about a day in the life of a bee.",
    "Explain how a bicycle stays upright while it moves.",
)
GOALS = {"grounded_c1": 1.6, "open_c1": 0.97, "high_concurrency": 1.0}


@dataclass
class Cell:
    """One configuration's run of one workload at one concurrency (over every round)."""

    tokens: int = 0
    seconds: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    outputs: dict[int, tuple[int, ...]] = field(default_factory=dict)  # prompt index -> ids
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    speculated: bool = False  # whether the engine reported speculation counters

    def summary(self) -> dict[str, Any]:
        """The cell as plain data (tokens/s, ms, acceptance)."""
        itl = sorted(self.itl_s)
        return {
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "tok_s": round(self.tokens / self.seconds, 2) if self.seconds else None,
            "itl_p50_ms": _ms(percentile(itl, 0.5)),
            "itl_p95_ms": _ms(percentile(itl, 0.95)),
            "num_drafts": self.drafts if self.speculated else None,
            "num_draft_tokens": self.draft_tokens if self.speculated else None,
            "num_accepted_tokens": self.accepted if self.speculated else None,
            "acceptance_rate": (
                round(self.accepted / self.draft_tokens, 3) if self.draft_tokens else None
            ),
            "mean_accepted_length": (
                round(1 + self.accepted / self.drafts, 3) if self.drafts else None
            ),
        }


def percentile(sorted_xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when it is empty."""
    return nearest_rank(sorted_xs, q) if sorted_xs else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def grounded_text(tokenizer: Any, target_tokens: int, rng: random.Random) -> str:
    """Sentences of SENTENCES in a random order, repeated as needed, up to about
    `target_tokens` tokens (the last sentence may pass it)."""
    parts: list[str] = []
    pool: list[str] = []
    while True:
        if not pool:
            pool = list(SENTENCES)
            rng.shuffle(pool)
        parts.append(pool.pop())
        text = " ".join(parts)
        if len(tokenizer.encode(text, add_special_tokens=False)) >= target_tokens:
            return text


def prompts(
    engine: LLMEngine, workload: str, count: int, args: argparse.Namespace
) -> list[tuple[int, ...]]:
    """`count` prompts of `workload`, as token ids through the chat template."""
    tok = engine.tokenizer
    rng = random.Random(args.seed)
    out = []
    for i in range(count):
        if workload == "grounded":
            text = grounded_text(tok, args.text_tokens, rng)
            content = (
                "Repeat the following text word for word, but write 'the council' wherever "
                f"it says 'the committee'.\n\n{text}"
            )
        else:
            content = OPEN_PROMPTS[i % len(OPEN_PROMPTS)]
        chat = tok.apply_chat_template([{"role": "user", "content": content}])
        out.append(tuple(tok.encode(chat, add_special_tokens=False)))
    return out


def run_cell(
    engine: LLMEngine,
    batch: list[tuple[int, ...]],
    concurrency: int,
    max_tokens: int,
    cell: Cell,
) -> None:
    """Serves `batch` with `concurrency` requests in flight, adding to `cell`."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    todo = deque(enumerate(batch))
    index: dict[str, int] = {}
    last: dict[str, float] = {}
    out: dict[str, list[int]] = {}
    before = engine.stats().spec_decode
    start = time.perf_counter()
    while todo or engine.has_unfinished():
        while todo and len(index) < concurrency:
            i, ids = todo.popleft()
            # Each request in a domain of its own: a round never reads another's cache.
            request = EngineRequest(prompt_token_ids=ids, params=params, cache_domain=f"r{i}")
            rid = engine.add_request(request)
            index[rid] = i
            out[rid] = []
            last[rid] = time.perf_counter()
        for event in engine.step():
            stamp = time.perf_counter()
            new = [t for d in event.deltas for t in d.token_ids]
            if new:
                rid = event.request_id
                if out[rid]:  # the first token's wait is the TTFT, not an ITL
                    cell.itl_s.extend([(stamp - last[rid]) / len(new)] * len(new))
                last[rid] = stamp
                out[rid].extend(new)
                cell.tokens += len(new)
            if event.finished:
                cell.outputs[index.pop(event.request_id)] = tuple(out.pop(event.request_id))
    cell.seconds += time.perf_counter() - start
    after = engine.stats().spec_decode
    if after is not None:
        cell.speculated = True
        cell.drafts += after.num_drafts - (before.num_drafts if before else 0)
        cell.draft_tokens += after.num_draft_tokens - (before.num_draft_tokens if before else 0)
        cell.accepted += after.num_accepted_tokens - (before.num_accepted_tokens if before else 0)


def build_engines(args: argparse.Namespace) -> dict[str, LLMEngine]:
    """The peer and the speculating engine, from `cloister serve`'s settings on the CPU."""
    common: dict[str, Any] = {"device": "cpu"}
    peer = Settings(**common)
    spec = Settings(
        **common,
        speculative_method="ngram",
        num_speculative_tokens=args.k,
        speculative_max_batch=args.max_batch,
    )
    return {
        "peer": LLMEngine.from_options(args.model, **serve_engine_options(peer)),
        "ngram": LLMEngine.from_options(args.model, **serve_engine_options(spec)),
    }


def _ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, rounded; None when either is missing."""
    if value is None or not reference:
        return None
    return round(value / reference, 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs every workload, concurrency and configuration; prints the table and the JSON
    line; returns the report."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF or HF folder (default: SmolLM2)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--max-batch", type=int, default=None, help="speculative_max_batch")
    p.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=3, help="per concurrency slot, level and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--text-tokens", type=int, default=500, help="grounded text length")
    p.add_argument("--new-tokens", type=int, default=256, help="max_tokens of each answer")
    p.add_argument("--warmup-tokens", type=int, default=32)
    p.add_argument("--workloads", default="grounded,open")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path, default=None, help="also write the report here")
    args = p.parse_args(argv)
    for name in ("k", "requests", "rounds", "text_tokens", "new_tokens"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error("--concurrency must be comma-separated integers")
    if not levels or min(levels) <= 0:
        p.error("--concurrency must be positive")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not workloads or set(workloads) - {"grounded", "open"}:
        p.error("--workloads are grounded and/or open")
    engines = build_engines(args)
    count = args.requests * max(levels)
    batches = {w: prompts(engines["peer"], w, count, args) for w in workloads}
    for engine in engines.values():  # warm-up: first steps, and the batch gate's figures
        for w in workloads:
            for c in levels:
                run_cell(engine, batches[w][:c], c, args.warmup_tokens, Cell())
    cells: dict[tuple[str, int, str], Cell] = {}
    for w in workloads:
        for c in levels:
            batch = batches[w][: args.requests * c]
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(reversed(engines))
                for name in order:
                    cell = cells.setdefault((w, c, name), Cell())
                    run_cell(engines[name], batch, c, args.new_tokens, cell)
                    # Progress on stderr: a full run takes many minutes on a CPU.
                    print(
                        f"[{w} c={c} round {r + 1}/{args.rounds}] {name}: {cell.tokens} tokens "
                        f"in {cell.seconds:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
    report: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}, "cells": []}
    print(
        f"{'workload':9} {'conc':>4} {'config':6} {'tok/s':>8} {'ITL p50':>8} {'ITL p95':>8} "
        f"{'accept':>7} {'mean len':>8} {'same':>5} {'ratio':>6}"
    )
    ratios: dict[tuple[str, int], float | None] = {}
    for w in workloads:
        for c in levels:
            peer = cells[(w, c, "peer")]
            for name in engines:
                cell = cells[(w, c, name)]
                s = cell.summary()
                same = sum(cell.outputs[i] == peer.outputs.get(i) for i in cell.outputs)
                s.update(
                    workload=w,
                    concurrency=c,
                    config=name,
                    same_output_share=round(same / max(1, len(cell.outputs)), 3),
                    tok_s_ratio=_ratio(s["tok_s"], peer.summary()["tok_s"]),
                )
                if name != "peer":
                    ratios[(w, c)] = s["tok_s_ratio"]
                report["cells"].append(s)
                print(
                    f"{w:9} {c:>4} {name:6} {s['tok_s'] or '-':>8} {s['itl_p50_ms'] or '-':>8} "
                    f"{s['itl_p95_ms'] or '-':>8} {_fmt(s['acceptance_rate']):>7} "
                    f"{_fmt(s['mean_accepted_length']):>8} {s['same_output_share']:>5} "
                    f"{_fmt(s['tok_s_ratio']):>6}"
                )
    high = max(levels)
    goals: dict[str, bool] = {}
    if "grounded" in workloads and 1 in levels:
        goals["grounded_c1_1.6x"] = (ratios[("grounded", 1)] or 0) >= GOALS["grounded_c1"]
    if "open" in workloads and 1 in levels:
        goals["open_c1_0.97x"] = (ratios[("open", 1)] or 0) >= GOALS["open_c1"]
    if high > 1:
        for w in workloads:
            goals[f"{w}_c{high}_1.0x"] = (ratios[(w, high)] or 0) >= GOALS["high_concurrency"]
    report["ratios"] = {f"{w}_c{c}": v for (w, c), v in ratios.items()}
    report["goals_met"] = goals
    for (w, c), v in ratios.items():
        print(f"{w} at concurrency {c}: ngram tokens/s x{_fmt(v)} of the peer")
    print("goals: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in goals.items()))
    line = json.dumps(report)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(line + "\n")
    print(line)
    return report


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


if __name__ == "__main__":
    main()
