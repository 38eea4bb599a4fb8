"""Decode throughput with LoRA adapters: the base alone, one adapter, and a mixed batch.

    python bench/multi_lora.py [--model DIR] [--adapters 4] [--rank 16] [--requests 16]
        [--tokens 32] [--kernel torch|triton] [--device cpu|cuda]

Without --model it builds a tiny random model (CPU smoke run: the figures say how
much the per-row matmul costs relative to the base there, not what a GPU does).
Every run uses greedy decoding with the prefix cache off, so each request computes
its whole prompt. Prints one line per scenario: the best tokens/s of three and the ratio to the base.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from engine.llm_engine import LLMEngine, build_config
from engine.sampling_params import SamplingParams
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.tiny_model import make_tiny_model_dir


def run(engine: LLMEngine, names: list[str | None], requests: int, tokens: int) -> float:
    """Generated tokens per second for `requests` requests cycling over `names`."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    for i in range(requests):
        prompt = [3 + i, 50, 700 + i, 9, 11, 13 + i, 400, 8]
        engine.add_request(prompt, params, adapter=names[i % len(names)], use_cache=False)
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return requests * tokens / (time.perf_counter() - start)


def main() -> None:
    """Parses the options, loads the adapters and prints the three scenarios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--kernel", choices=("torch", "triton"), default="torch")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="multi-lora-"))
    model = Path(args.model) if args.model else make_tiny_model_dir(root)
    config = build_config(
        str(model),
        device=args.device,
        max_loras=args.adapters,
        max_lora_rank=args.rank,
        lora_kernel=args.kernel,
        max_model_len=256,
    )
    engine = LLMEngine(config)
    names: list[str | None] = []
    for i in range(args.adapters):
        name = f"lora{i}"
        folder = make_peft_adapter(root / name, model, args.rank, 2 * args.rank, seed=i)
        engine.load_adapter(name, str(folder))
        names.append(name)
    run(engine, [None, *names], 2 * len(names) + 2, 4)  # warm-up (and slot loads)
    scenarios: list[tuple[str, list[str | None]]] = [
        ("base", [None]),
        ("one adapter", names[:1]),
        (f"{args.adapters} adapters + base, mixed", [*names, None]),
    ]
    # Best of three, interleaved, so that a noisy (shared) machine hurts every scenario alike.
    rates = {label: 0.0 for label, _ in scenarios}
    for _ in range(3):
        for label, mix in scenarios:
            rates[label] = max(rates[label], run(engine, mix, args.requests, args.tokens))
    for label, rate in rates.items():
        print(f"{label:32s} {rate:10.1f} tok/s  {rate / rates['base']:5.2f}x base")


if __name__ == "__main__":
    main()
