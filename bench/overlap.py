"""Overlap scheduling: per-step host time and its share of the step, in turn vs overlapped.

The peer is the same engine with overlap off (`overlap_scheduling=False`, what
`--no-overlap` gives). Each configuration runs the same requests (all queued at
once, greedy, `--output-tokens` each, EOS ignored) in both modes, alternating, and
reports per step:
- model time: the forward pass and the logits (on the forward worker with overlap);
- host time left in the step: wall time per step minus model time, i.e. what the
  host's scheduling, input building, sampling bookkeeping and detokenizing add to
  each step's latency (overlap hides what it can of it behind the forward pass);
- decode tokens/s, and overlapped over in turn.

Workloads:
- `fake-Nms`: the engine over a fake model whose forward pass takes N ms with the GIL
  released, as a GPU's kernels would (tests/utils/fast_fake_model.py): host time is
  the engine's own, as on a GPU, where it is a large share of a short step;
- `smollm2-<weights>`: the bundled SmolLM2-135M on this CPU, where the forward pass
  holds the cores and the host share is small;
- `model`: the model at `--model PATH` on `--device` (scripts/gpu_check.sh's overlap
  step: random weights in SmolLM2's shape on the GPU, where a step is short).

    .venv/bin/python bench/overlap.py [--batch 8,32] [--output-tokens 64]
        [--workloads fake-2ms,fake-8ms,smollm2-int4,smollm2-none] [--repeats 2]
        [--model PATH --device cuda]

The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.arg_types import at_least  # noqa: E402
from engine.engine_builder import build_config  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.request import EngineRequest  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402


@dataclass(frozen=True)
class Run:
    """One workload, batch and mode: per-step figures and throughput."""

    workload: str
    batch: int
    overlap: bool
    steps: int
    step_ms: float  # wall time per step
    model_ms: float  # forward pass and logits per step
    host_ms: float  # step_ms - model_ms: host time the step's latency still carries
    host_share: float  # host_ms / step_ms
    tokens_per_s: float


def build(workload: str, overlap: bool, batch: int, args: argparse.Namespace) -> LLMEngine:
    """An engine for `workload` with overlap on or off."""
    common: dict[str, Any] = {"overlap_scheduling": overlap, "max_num_seqs": max(batch, 1)}
    if workload == "model":
        return LLMEngine(build_config(args.model, device=args.device, **common))
    if workload.startswith("fake-"):
        from tests.utils.fast_fake_model import fast_fake_llm_engine

        compute_s = float(workload.removeprefix("fake-").removesuffix("ms")) / 1000
        return fast_fake_llm_engine(compute_s=compute_s, num_blocks=4096, **common)
    weights = workload.removeprefix("smollm2-")
    return LLMEngine(build_config(None, weight_quant=weights, **common))


def timed(engine: LLMEngine) -> list[float]:
    """Wraps the forward pass and the logits to add their seconds to the returned cell."""
    spent = [0.0]

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - began

        return inner

    runner = engine.runner
    runner._forward = wrap(runner._forward)  # type: ignore[method-assign]
    runner.model.compute_logits = wrap(runner.model.compute_logits)  # type: ignore[method-assign]
    return spent


def measure(
    workload: str,
    overlap: bool,
    batch: int,
    output_tokens: int,
    seed: int,
    args: argparse.Namespace,
) -> Run:
    """Prefills `batch` requests, then times the decode steps to the end."""
    engine = build(workload, overlap, batch, args)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    for i in range(batch):
        prompt = tuple(rng.randrange(100, 20000) for _ in range(64))
        engine.add_request(EngineRequest(prompt_token_ids=prompt, params=params, request_id=f"{i}"))
    engine.step()  # the prefill (and, with overlap, its launch): not timed
    engine.step()
    spent = timed(engine)
    generated = engine.stats(domains=False).num_generated_tokens
    steps = 0
    began = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
        steps += 1
    wall = time.perf_counter() - began
    tokens = engine.stats(domains=False).num_generated_tokens - generated
    engine.close()
    step_ms = wall / steps * 1000
    model_ms = spent[0] / steps * 1000
    host_ms = max(0.0, step_ms - model_ms)
    return Run(
        workload,
        batch,
        overlap,
        steps,
        round(step_ms, 3),
        round(model_ms, 3),
        round(host_ms, 3),
        round(host_ms / step_ms, 4),
        round(tokens / wall, 1),
    )


WORKLOAD = re.compile(r"fake-\d+(\.\d+)?ms|smollm2-(none|int8|int4)|model")


def batches(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated batch sizes from 1 to 512."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list") from None
    if not all(1 <= v <= 512 for v in values):
        raise argparse.ArgumentTypeError("every batch must be between 1 and 512")
    return values


def workloads(text: str) -> tuple[str, ...]:
    """An argparse type: fake-<N>ms, smollm2-<none|int8|int4> or model (--model's)."""
    names = tuple(text.split(","))
    bad = [n for n in names if not WORKLOAD.fullmatch(n)]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown {', '.join(bad)}; known: fake-<N>ms, smollm2-none|int8|int4, model"
        )
    return names


def main(argv: list[str] | None = None) -> None:
    """Runs every workload and batch in both modes and prints the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=batches, default=(8, 32))
    parser.add_argument("--output-tokens", type=at_least(2), default=64)
    parser.add_argument(
        "--workloads",
        type=workloads,
        default=workloads("fake-2ms,fake-8ms,smollm2-int4,smollm2-none"),
    )
    parser.add_argument("--repeats", type=at_least(1), default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="the folder or file of workload `model`")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args(argv)
    if "model" in args.workloads and not args.model:
        parser.error("--workloads model needs --model PATH")
    rows: list[dict[str, Any]] = []
    for workload in args.workloads:
        for batch in args.batch:
            best: dict[bool, Run] = {}
            for _ in range(args.repeats):
                for overlap in (False, True):  # alternating, so drift hits both
                    run = measure(workload, overlap, batch, args.output_tokens, args.seed, args)
                    if overlap not in best or run.tokens_per_s > best[overlap].tokens_per_s:
                        best[overlap] = run
            in_turn, overlapped = best[False], best[True]
            ratio = overlapped.tokens_per_s / in_turn.tokens_per_s
            print(
                f"{workload:>14} batch {batch:>3}: in turn {in_turn.tokens_per_s:8.1f} tok/s "
                f"(step {in_turn.step_ms:6.2f} ms, host {in_turn.host_ms:5.2f} ms = "
                f"{in_turn.host_share:5.1%}) | overlapped {overlapped.tokens_per_s:8.1f} tok/s "
                f"(step {overlapped.step_ms:6.2f} ms, host {overlapped.host_ms:5.2f} ms = "
                f"{overlapped.host_share:5.1%}) | x{ratio:.3f}",
                flush=True,
            )
            rows.append(
                {
                    "in_turn": asdict(in_turn),
                    "overlapped": asdict(overlapped),
                    "ratio": round(ratio, 3),
                }
            )
    print(json.dumps({"bench": "overlap", "runs": rows}))


if __name__ == "__main__":
    main()
