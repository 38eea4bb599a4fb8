"""Offline throughput: our engine against Hugging Face transformers on the same prompts.

64 requests, prompts of 150-400 tokens, 128 greedy output tokens (EOS ignored),
SmolLM2-135M-Instruct in fp32 on the CPU. The peer is `generate` in static
batches of 16 with left padding; when this transformers version has continuous
batching (`generate_batch`) it is measured too. `--weight-quant none,int4` measures
ours once per weight format (engine/model/quant.py); the ratio is the first one's.
The last line is JSON.

    .venv/bin/python bench/offline_throughput.py [--requests 64] [--output-tokens 128]
        [--weight-quant none,int4]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from engine import LLM, SamplingParams  # noqa: E402
from engine.model.loader import default_model_path  # noqa: E402


def make_prompts(tokenizer, count: int, seed: int) -> list[list[int]]:  # noqa: ANN001
    """Prompts of 150-400 tokens cut from varied natural-ish text."""
    rng = random.Random(seed)
    words = [
        "the",
        "a",
        "cache",
        "tenant",
        "block",
        "token",
        "model",
        "request",
        "server",
        "memory",
        "latency",
        "batch",
        "queue",
        "prefix",
        "radix",
        "hash",
        "engine",
        "kernel",
        "page",
        "attention",
        "layer",
        "weight",
        "scheduler",
        "budget",
        "stream",
        "user",
        "system",
        "prompt",
        "answer",
        "question",
        "river",
        "mountain",
        "city",
        "music",
        "history",
    ]
    prompts = []
    for _ in range(count):
        target = rng.randint(150, 400)
        text = " ".join(rng.choice(words) for _ in range(target * 2))
        ids = tokenizer.encode(text)[:target]
        prompts.append(ids)
    return prompts


def bench_ours(
    prompts: list[list[int]], new_tokens: int, weight_quant: str = "none"
) -> tuple[float, list[list[int]]]:
    llm = LLM(
        weight_quant=weight_quant,
        max_model_len=1024,
        # Room for every request's whole length (64 x ~400 tokens x 46 KB in fp32): with
        # 1 GiB the batch preempted and recomputed, which measured the pool, not the engine.
        kv_cache_bytes=2 << 30,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=4096,
    )
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(
        prompts[:2], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    )  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    print(f"  preemptions: {llm.engine.scheduler.num_preemptions}", flush=True)
    return elapsed, [o.outputs[0].token_ids for o in outs]


def load_hf():  # noqa: ANN201
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
    )
    return model.eval()


def bench_hf_static(
    model, prompts: list[list[int]], new_tokens: int, batch: int, pad_id: int
) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, p in enumerate(chunk):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
        print(f"  hf static batch {i // batch + 1}/{-(-len(prompts) // batch)} done", flush=True)
    return time.perf_counter() - start


def bench_hf_continuous(model, prompts: list[list[int]], new_tokens: int) -> float | None:  # noqa: ANN001
    if not hasattr(model, "generate_batch"):
        return None
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=-1,
        use_cuda_graph=False,
        num_blocks=4096,
        block_size=16,
        max_batch_tokens=4096,
    )
    start = time.perf_counter()
    try:
        with torch.no_grad():
            model.generate_batch(inputs=prompts, generation_config=config)
    except Exception as exc:  # its CPU support varies between versions: report, do not fail
        print(f"  hf generate_batch failed: {type(exc).__name__}: {exc}", flush=True)
        return None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-continuous", action="store_true")
    parser.add_argument("--weight-quant", default="none", help="comma-separated: none,int8,int4")
    args = parser.parse_args()

    llm_for_tok = LLM(max_model_len=1024, num_blocks=8)
    prompts = make_prompts(llm_for_tok.tokenizer, args.requests, args.seed)
    del llm_for_tok
    total_out = args.requests * args.output_tokens
    print(
        f"{args.requests} requests, prompt tokens {sum(map(len, prompts))}, "
        f"output tokens {total_out}, torch threads {torch.get_num_threads()}",
        flush=True,
    )

    modes = args.weight_quant.split(",")
    ours: dict[str, float] = {}
    for mode in modes:
        ours[mode], _ = bench_ours(prompts, args.output_tokens, mode)
        print(
            f"ours (weights {mode}): {ours[mode]:.1f} s, {total_out / ours[mode]:.1f} output tok/s",
            flush=True,
        )
    ours_s = ours[modes[0]]

    model = load_hf()
    hf_s = bench_hf_static(model, prompts, args.output_tokens, args.hf_batch, pad_id=0)
    print(
        f"hf static (batch {args.hf_batch}): {hf_s:.1f} s, {total_out / hf_s:.1f} tok/s", flush=True
    )
    result = {
        "ours_tok_s": round(total_out / ours_s, 2),
        "hf_tok_s": round(total_out / hf_s, 2),
        "ratio": round(hf_s / ours_s, 3),
    }
    for mode in modes[1:]:
        result[f"ours_{mode}_tok_s"] = round(total_out / ours[mode], 2)
        result[f"ratio_{mode}"] = round(hf_s / ours[mode], 3)
    if not args.skip_continuous:
        cb_s = bench_hf_continuous(model, prompts, args.output_tokens)
        if cb_s is not None:
            print(f"hf generate_batch: {cb_s:.1f} s, {total_out / cb_s:.1f} tok/s", flush=True)
            result["hf_continuous_tok_s"] = round(total_out / cb_s, 2)
            result["ratio_vs_continuous"] = round(cb_s / ours_s, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
