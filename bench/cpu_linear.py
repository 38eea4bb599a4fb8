"""Decode steps on the CPU with and without oneDNN-packed linears (engine/model/cpu_linear.py).

The bundled SmolLM2-135M in fp32, one torch thread (as `cloister serve` runs it beside
the gateway), in-process engine: for each batch size, that many greedy requests
decode `--output-tokens` tokens together (EOS ignored, one short shared prompt, so the
steps are decode steps), first with the plain torch linears (the peer), then with the
packed weights. Prints each side's milliseconds per decode step and the ratio; the
last line is JSON.

    .venv/bin/python bench/cpu_linear.py [--batches 1,2,4,8,16,32] [--output-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams  # noqa: E402

PROMPT = [1, 504, 3458, 282, 253, 1345, 30]  # a few ordinary SmolLM2 token ids


def per_step_ms(llm: LLM, batch: int, output_tokens: int) -> float:
    """Milliseconds per decode step of `batch` sequences (the prompt step excluded)."""
    params = SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True)
    prompts = [PROMPT] * batch
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    start = time.perf_counter()
    llm.generate(prompts, params)
    whole = time.perf_counter() - start
    start = time.perf_counter()
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    prompt_step = time.perf_counter() - start
    return 1000 * (whole - prompt_step) / (output_tokens - 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measures both sides at every batch size; prints the table, then the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--output-tokens", type=int, default=32)
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        p.error(f"--batches: {args.batches!r} is not a comma-separated list of whole numbers")
    if min(batches) < 1 or max(batches) > 256:
        p.error("--batches: every batch must be between 1 and 256")
    if args.output_tokens < 2:
        p.error(f"--output-tokens: must be at least 2, not {args.output_tokens}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    sides: dict[str, dict[int, float]] = {}
    try:
        for side, packed in (("torch", False), ("packed", True)):
            llm = LLM(
                cpu_packed_linears=packed,
                max_model_len=512,
                kv_cache_bytes=256 << 20,
                max_num_seqs=max(batches),
            )
            sides[side] = {b: per_step_ms(llm, b, args.output_tokens) for b in batches}
            del llm
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (a test)
    print(f"{'batch':>5s} {'torch ms':>9s} {'packed ms':>10s} {'speed-up':>9s}")
    ratios = {}
    for b in batches:
        ratios[b] = sides["torch"][b] / sides["packed"][b]
        print(f"{b:5d} {sides['torch'][b]:9.1f} {sides['packed'][b]:10.1f} {ratios[b]:8.2f}x")
    report = {
        "model": "SmolLM2-135M-Instruct fp32, 1 thread",
        "ms_per_decode_step": {
            s: {str(b): round(v, 2) for b, v in d.items()} for s, d in sides.items()
        },
        "speedup_vs_torch": {str(b): round(r, 3) for b, r in ratios.items()},
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
