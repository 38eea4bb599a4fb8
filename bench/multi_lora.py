"""Multi-LoRA serving: throughput with 1, 4 and 16 adapters against the base, and TTFT over slots.

    python bench/multi_lora.py [--model PATH | --tiny] [--rank 16] [--requests 32]
        [--prompt-len 32] [--tokens 32] [--rounds 3] [--kernel torch|triton] [--device cpu]
        [--ttft-adapters 16] [--ttft-slots 8] [--ttft-requests 64] [--ttft-per-step 2] [--threads N]
        [--skip-throughput] [--skip-ttft]

The model: --model (a GGUF file or an HF folder), else the bundled SmolLM2-135M GGUF
when its package is installed, else (or with --tiny) a tiny random model. Adapters are
random PEFT adapters of --rank on all seven projections, built from the loaded model's
architecture (so a GGUF model needs no config.json). Greedy decoding, prefix cache off:
every request computes its whole prompt.

Throughput: --requests requests of --prompt-len tokens, all added at once, each
generating --tokens; "N adapters" cycles the requests over N distinct adapters (no
base rows), "base" runs them on the base model. Engine: max_loras 16. The figure is
generated tokens per second over the whole run (prefill included), best of --rounds,
the scenarios interleaved round by round so a noisy machine hurts them alike.

TTFT: a steady stream of --ttft-requests requests cycling over --ttft-adapters adapters,
--ttft-per-step new ones added before every engine step (the same arrival pattern, in
steps, on both sides), each generating --tokens. "over slots": max_loras
--ttft-slots; "in slots": max_loras = --ttft-adapters. TTFT is wall time from a request's
add_request to the end of the step that produced its first token; p50 and p95 over all
requests, best (lowest p50) of --rounds, interleaved. The stream's output tokens per
second are printed beside: over the slots, adapters take turns (engine/lora/slots.py),
so the TTFT stays low and the decode is what pays.

The last line is JSON with every figure and the goals: 16 adapters within 30% of the
base's throughput, and the over-slots TTFT p50 within 3x of the in-slot one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Run as a script (python bench/NAME.py), this folder is on the path, not the project's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import ModelArchitecture  # noqa: E402
from engine.engine_builder import build_config  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model.loader import LoadedModel, default_model_path, load_model  # noqa: E402
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams  # noqa: E402
from tests.utils.lora_adapters import make_peft_adapter  # noqa: E402
from tests.utils.tiny_model import make_tiny_model_dir  # noqa: E402

THROUGHPUT_SCENARIOS = (0, 1, 4, 16)  # distinct adapters; 0: the base model
THROUGHPUT_GOAL = 0.70  # 16 adapters keep at least this share of the base's tokens/s
TTFT_GOAL = 3.0  # over-slots TTFT p50 at most this many times the in-slot one


@dataclass(frozen=True)
class Setup:
    """The loaded model, its adapters and the options every engine shares."""

    loaded: LoadedModel
    model_path: str
    adapters: list[tuple[str, Path]]
    options: dict[str, Any]


def resolve_model(args: argparse.Namespace, root: Path) -> str:
    """--model, else the bundled SmolLM2 (if installed), else a tiny random model."""
    if args.model:
        return str(args.model)
    if not args.tiny:
        try:
            return default_model_path()
        except Exception:  # the bundled package is optional
            pass
    return str(make_tiny_model_dir(root))


def make_engine(setup: Setup, max_loras: int) -> LLMEngine:
    """An engine on the shared loaded model with every adapter registered."""
    config = build_config(setup.model_path, max_loras=max_loras, **setup.options)
    engine = LLMEngine(config, setup.loaded)
    for name, folder in setup.adapters:
        engine.load_adapter(name, str(folder))
    return engine


def prompts(arch: ModelArchitecture, count: int, length: int) -> list[list[int]]:
    """Fixed pseudo-random prompts (the same on every side)."""
    g = torch.Generator().manual_seed(1234)
    return torch.randint(10, arch.vocab_size - 10, (count, length), generator=g).tolist()


def throughput(
    engine: LLMEngine, names: list[str | None], batch: list[list[int]], tokens: int
) -> float:
    """Generated tokens per second for `batch` added at once, cycling over `names`."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(batch):
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(prompt),
                params=params,
                adapter=names[i % len(names)],
                cache=False,
            )
        )
    while engine.has_unfinished():
        engine.step()
    return len(batch) * tokens / (time.perf_counter() - start)


@dataclass(frozen=True)
class StreamResult:
    """A stream's TTFTs (s) and its output tokens per second."""

    ttfts: list[float]
    tok_s: float


def ttft_stream(
    engine: LLMEngine, names: list[str], batch: list[list[int]], tokens: int, per_step: int
) -> StreamResult:
    """Each request's TTFT for a stream of `per_step` arrivals before every step, and the
    stream's throughput (what sharing the slots costs the decode)."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    added: dict[str, float] = {}
    first: dict[str, float] = {}
    next_req = 0
    while next_req < len(batch) or engine.has_unfinished():
        for _ in range(per_step):
            if next_req == len(batch):
                break
            name = names[next_req % len(names)]
            rid = engine.add_request(
                EngineRequest(
                    prompt_token_ids=tuple(batch[next_req]),
                    params=params,
                    adapter=name,
                    cache=False,
                )
            )
            added[rid] = time.perf_counter()
            next_req += 1
        events = engine.step()
        now = time.perf_counter()
        for event in events:
            first.setdefault(event.request_id, now)
    rate = len(batch) * tokens / (time.perf_counter() - min(added.values()))
    return StreamResult([first[rid] - added[rid] for rid in added], rate)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Runs both benchmarks and prints a line per figure, then the JSON summary (returned)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel", choices=("torch", "triton"), default="torch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ttft-adapters", type=int, default=16)
    parser.add_argument("--ttft-slots", type=int, default=8)
    parser.add_argument("--ttft-requests", type=int, default=64)
    parser.add_argument("--ttft-per-step", type=int, default=2)
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # on a shared machine, 1 avoids OpenMP spinning
    root = Path(tempfile.mkdtemp(prefix="multi-lora-"))
    model_path = resolve_model(args, root)
    loaded = load_model(model_path, dtype=torch.float32, device=args.device)
    arch = loaded.arch
    count = max(max(THROUGHPUT_SCENARIOS), args.ttft_adapters)
    adapters = [
        (f"lora{i}", make_peft_adapter(root / f"lora{i}", arch, args.rank, 2 * args.rank, seed=i))
        for i in range(count)
    ]
    per_seq = args.prompt_len + args.tokens
    options: dict[str, Any] = {
        "device": args.device,
        "max_lora_rank": args.rank,
        "lora_kernel": args.kernel,
        "max_model_len": per_seq + 16,
        "block_size": 16,
        "num_blocks": (max(args.requests, args.ttft_requests) + 1) * (per_seq // 16 + 2),
        "max_num_seqs": max(args.requests, args.ttft_requests),
        "max_num_batched_tokens": max(2048, args.requests * args.prompt_len),
    }
    setup = Setup(loaded, model_path, adapters, options)
    names = [name for name, _ in adapters]
    print(
        f"model {loaded.name}: {arch.num_layers} layers, hidden {arch.hidden_size}; "
        f"rank {args.rank}, device {args.device}, {torch.get_num_threads()} threads"
    )
    summary: dict[str, Any] = {
        "model": loaded.name,
        "rank": args.rank,
        "kernel": args.kernel,
        "requests": args.requests,
        "prompt_len": args.prompt_len,
        "tokens": args.tokens,
        "rounds": args.rounds,
    }

    if not args.skip_throughput:
        _throughput_part(args, setup, names, summary)
    if not args.skip_ttft:
        _ttft_part(args, setup, names, summary)
    print(json.dumps(summary, sort_keys=True))
    return summary


def _throughput_part(
    args: argparse.Namespace, setup: Setup, names: list[str], summary: dict[str, Any]
) -> None:
    """1, 4 and 16 adapters against the base on the same prompts."""
    arch = setup.loaded.arch
    engine = make_engine(setup, max_loras=max(THROUGHPUT_SCENARIOS))
    batch = prompts(arch, args.requests, args.prompt_len)
    mixes: dict[int, list[str | None]] = {
        n: (list(names[:n]) if n else [None]) for n in THROUGHPUT_SCENARIOS
    }
    throughput(engine, [None, *names[:16]], batch[:17], 2)  # warm-up, and every slot loaded
    rates = dict.fromkeys(THROUGHPUT_SCENARIOS, 0.0)
    for _ in range(args.rounds):
        for n, mix in mixes.items():
            rate = throughput(engine, mix, batch, args.tokens)
            rates[n] = max(rates[n], rate)
            print(f"  round: {n} adapters {rate:.1f} tok/s", file=sys.stderr, flush=True)
    for n, rate in rates.items():
        label = "base" if n == 0 else f"{n} adapters"
        print(f"throughput {label:12s} {rate:9.1f} tok/s  {rate / rates[0]:5.2f}x base")
    summary["throughput_tok_s"] = {
        ("base" if n == 0 else str(n)): round(r, 2) for n, r in rates.items()
    }
    summary["throughput_ratio"] = {
        str(n): round(rates[n] / rates[0], 3) for n in THROUGHPUT_SCENARIOS if n
    }
    ratio16 = rates[16] / rates[0]
    summary["goal_16_adapters_within_30pct"] = ratio16 >= THROUGHPUT_GOAL


def _ttft_part(
    args: argparse.Namespace, setup: Setup, names: list[str], summary: dict[str, Any]
) -> None:
    """TTFT with twice the adapters over the slots against all of them in slots."""
    arch = setup.loaded.arch
    over = make_engine(setup, max_loras=args.ttft_slots)
    within = make_engine(setup, max_loras=args.ttft_adapters)
    stream = prompts(arch, args.ttft_requests, args.prompt_len)
    active = names[: args.ttft_adapters]
    for e in (over, within):
        ttft_stream(e, active, stream[: 2 * len(active)], 2, len(active))  # warm-up
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.rounds):
        for label, e in (("over_slots", over), ("in_slots", within)):
            run = ttft_stream(e, active, stream, args.tokens, args.ttft_per_step)
            p50, p95 = percentile(run.ttfts, 0.50), percentile(run.ttfts, 0.95)
            print(f"  round: {label} p50 {p50:.3f} s", file=sys.stderr, flush=True)
            if label not in best or p50 < best[label][0]:
                best[label] = (p50, p95, run.tok_s)
    for label, (p50, p95, tok_s) in best.items():
        slots = args.ttft_slots if label == "over_slots" else args.ttft_adapters
        print(
            f"ttft {label:10s} {args.ttft_adapters} adapters, {slots:2d} slots: "
            f"p50 {p50 * 1e3:8.1f} ms  p95 {p95 * 1e3:8.1f} ms  {tok_s:7.1f} tok/s"
        )
    ratio = best["over_slots"][0] / best["in_slots"][0]
    print(f"ttft p50 over/in slots {ratio:5.2f}x")
    summary["ttft"] = {
        "adapters": args.ttft_adapters,
        "slots_over": args.ttft_slots,
        "requests": args.ttft_requests,
        "arrivals_per_step": args.ttft_per_step,
        **{f"{k}_p50_ms": round(v[0] * 1e3, 2) for k, v in best.items()},
        **{f"{k}_p95_ms": round(v[1] * 1e3, 2) for k, v in best.items()},
        "p50_ratio": round(ratio, 3),
        "p95_ratio": round(best["over_slots"][1] / best["in_slots"][1], 3),
        **{f"{k}_tok_s": round(v[2], 2) for k, v in best.items()},
    }
    summary["goal_ttft_p50_within_3x"] = ratio <= TTFT_GOAL


if __name__ == "__main__":
    main()
