"""Hugging Face transformers as the peer of the engine, on the same seeded random weights.

The engine's `LlamaForCausalLM` uses Hugging Face's parameter names, so its state dict
loads into transformers' `LlamaForCausalLM` as is: the HF model is built on the meta
device and takes the engine model's tensors by `assign` (no copy, no second 16 GB for
an 8B shape). `bench/gpu_decode.py --parts hf` calls `hf_figures`, which measures:

  parity      greedy tokens (a few prompts, ~32 new tokens) of our engine vs HF on the
              same weights and device: float32 (expected identical), bfloat16 on CUDA,
              and our triton attention backend vs our torch one; the first divergence
              and whether the flip is within a rounding margin (`compare_greedy`);
  throughput  decode tokens/s of HF `generate` (greedy, EOS suppressed by
              min_new_tokens, default dynamic cache, sdpa) vs our engine (CUDA graphs)
              at the same batch, prompt length and new tokens; ratio ours/HF.

Everything is bounded by a deadline and never raises: failures become notes.

    python bench/hf_peer.py --plot gpu.json decode_vs_hf.png   # tokens/s vs batch
"""

from __future__ import annotations

import argparse
import gc
import inspect
import itertools
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import gpu_engine  # noqa: E402
from bench.model_shape import ModelShape  # noqa: E402
from engine.config import ModelArchitecture  # noqa: E402
from engine.llm_engine import LLMEngine  # noqa: E402
from engine.model.llama import LlamaForCausalLM  # noqa: E402
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams  # noqa: E402

Greedy = list[tuple[list[int], list[dict[int, float]]]]
TOP_LOGPROBS = 5  # as many as `gpu_engine.greedy_run` asks the engine for


def hf_config(arch: ModelArchitecture, attn_implementation: str = "sdpa") -> Any:
    """transformers' LlamaConfig of `arch` (default rope, no biases, the engine's EOS id)."""
    from transformers import LlamaConfig

    if arch.rope_scaling is not None or arch.attention_bias:
        raise ValueError("the peer covers plain Llama shapes only (no rope scaling, no bias)")
    eos = arch.vocab_size - 1  # the stand-in tokenizer's EOS (gpu_engine.IdTokenizer)
    # Keyword arguments (rope_theta, attn_implementation) that older and newer
    # transformers both accept, though 5.2x's typed signature does not list them all.
    kwargs: dict[str, Any] = {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_layers,
        "num_attention_heads": arch.num_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": None,
        "eos_token_id": eos,
        "pad_token_id": eos,
        "attn_implementation": attn_implementation,
    }
    config = LlamaConfig(**kwargs)
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if theta != arch.rope_theta:  # a version that ignored the keyword would silently differ
        raise ValueError(f"LlamaConfig took rope_theta {theta}, expected {arch.rope_theta}")
    return config


@torch.no_grad()
def hf_from_ours(model: LlamaForCausalLM, attn_implementation: str = "sdpa") -> Any:
    """transformers' LlamaForCausalLM sharing `model`'s weight tensors (same device, dtype).

    Raises ValueError when a name or shape does not map or a tensor stays on meta.
    """
    from transformers import LlamaForCausalLM as HFLlama

    config = hf_config(model.arch, attn_implementation)
    weight = model.model.embed_tokens.weight
    with torch.device("meta"):
        hf: Any = HFLlama(config)
    state = {name: t.detach() for name, t in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"weight names do not map: missing {missing}, unexpected {unexpected}")
    # The rotary tables are derived buffers, left on meta: rebuild them on the device.
    with torch.device(weight.device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=config)
    hf.model.rotary_emb.to(weight.device)
    hf.tie_weights()
    on_meta = [
        n for n, t in itertools.chain(hf.named_parameters(), hf.named_buffers()) if t.is_meta
    ]
    if on_meta:
        raise ValueError(f"tensors left on the meta device: {on_meta[:4]}")
    hf.requires_grad_(False)
    return hf.eval()


def _top(logits: torch.Tensor) -> dict[int, float]:
    """{token id: logprob} of the TOP_LOGPROBS most likely tokens of one row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(TOP_LOGPROBS)
    return dict(zip(ids.tolist(), values.tolist(), strict=True))


@torch.no_grad()
def hf_greedy(hf: Any, prompts: Sequence[Sequence[int]], steps: int) -> Greedy:
    """Plain arg-max decoding with HF's own KV cache, one prompt at a time (no padding,
    no logits processors); the same format as `gpu_engine.greedy_run`."""
    device = hf.model.embed_tokens.weight.device
    # transformers renamed `past_key_values` to `cache` (5.2x); the GPU image may be older.
    cache_arg = "cache" if "cache" in inspect.signature(hf.forward).parameters else None
    result: Greedy = []
    for prompt in prompts:
        tokens: list[int] = []
        tops: list[dict[int, float]] = []
        out = hf(torch.tensor([list(prompt)], device=device), use_cache=True)
        for step in range(steps):
            last = out.logits[0, -1]
            tokens.append(int(last.argmax()))
            tops.append(_top(last))
            if step + 1 < steps:
                nxt = torch.tensor([[tokens[-1]]], device=device)
                if cache_arg == "cache":
                    out = hf(nxt, cache=out.cache, use_cache=True)
                else:
                    out = hf(nxt, past_key_values=out.past_key_values, use_cache=True)
        result.append((tokens, tops))
    return result


def _engine(
    model: LlamaForCausalLM,
    device: torch.device,
    *,
    max_num_seqs: int,
    tokens_per_seq: int,
    max_num_batched_tokens: int,
    backend: str = "auto",
    name: str = "random",
) -> LLMEngine:
    """An engine around `model` with room for `max_num_seqs` sequences of `tokens_per_seq`."""
    dtype = model.model.embed_tokens.weight.dtype
    blocks = max_num_seqs * -(-tokens_per_seq // gpu_engine.BLOCK_SIZE) + 16
    # The torch reference backend is not meant for graph capture; it runs eager.
    return gpu_engine.make_engine(
        model,
        name=name,
        dtype=dtype,
        device=device,
        num_blocks=blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        attention_backend=backend,
        cuda_graphs=backend != "torch",
    )


def _ours_greedy(
    model: LlamaForCausalLM,
    device: torch.device,
    prompts: Sequence[Sequence[int]],
    steps: int,
    backend: str,
) -> Greedy:
    longest = max(len(p) for p in prompts) + steps
    engine = _engine(
        model,
        device,
        max_num_seqs=len(prompts),
        tokens_per_seq=longest,
        max_num_batched_tokens=max(2048, longest),
        backend=backend,
    )
    engine.keep_finished = True
    return gpu_engine.greedy_run(engine, prompts, steps)


def parity(
    shape: ModelShape,
    device: torch.device,
    *,
    num_prompts: int = 4,
    steps: int = 32,
    seed: int = 4321,
) -> dict[str, Any]:
    """Greedy tokens, same random weights and device: ours vs HF (float32, and bfloat16 on
    CUDA), and our triton attention backend vs our torch one. `passed` is the float32
    comparison's; the others are reported with their rounding explanation."""
    lens, prompts = gpu_engine.ragged_prompts(num_prompts, 80, shape.vocab_size, seed)
    arch = gpu_engine.arch_from_shape(shape, max(lens) + steps + 64)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    cuda = device.type == "cuda"
    dtypes = [torch.float32] + ([torch.bfloat16] if cuda else [])
    comparisons: dict[str, Any] = {}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        model = gpu_engine.random_model(arch, dtype=dtype, device=device, seed=seed)
        ref = hf_greedy(hf_from_ours(model), prompts, steps)
        ours = _ours_greedy(model, device, prompts, steps, "auto")
        comparisons[f"ours_vs_hf_{name}"] = gpu_engine.compare_greedy(ref, ours, lens)
        if cuda or interpreted:
            # "auto" is triton on CUDA and torch elsewhere; run the other one.
            other = _ours_greedy(model, device, prompts, steps, "torch" if cuda else "triton")
            torch_ref, triton = (other, ours) if cuda else (ours, other)
            comparisons[f"triton_vs_torch_{name}"] = gpu_engine.compare_greedy(
                torch_ref, triton, lens
            )
        del model
        _free(device)
    return {
        "shape": shape.name,
        "device": str(device),
        "steps": steps,
        "prompt_lens": lens,
        "comparisons": comparisons,
        "passed": bool(comparisons["ours_vs_hf_float32"]["passed"]),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _StepClock:
    """A logits processor that only stamps the time of each generation step: called once
    per step, after that step's forward (the first right after the prefill)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stamps: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        _sync(self.device)
        self.stamps.append(time.perf_counter())
        return scores


@torch.no_grad()
def hf_generate_seconds(hf: Any, input_ids: torch.Tensor, new_tokens: int) -> tuple[float, float]:
    """(seconds until the first token's logits, seconds of the rest) of one greedy
    `generate` of exactly `new_tokens` tokens per row (EOS held off by min_new_tokens)."""
    from transformers import GenerationConfig, LogitsProcessorList

    make_config: Any = GenerationConfig  # untyped constructor
    eos = hf.config.eos_token_id
    config = make_config(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=eos,
        pad_token_id=eos,
        use_cache=True,
    )
    clock = _StepClock(input_ids.device)
    _sync(input_ids.device)
    t0 = time.perf_counter()
    out = hf.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        generation_config=config,
        logits_processor=LogitsProcessorList([clock]),
    )
    _sync(input_ids.device)
    end = time.perf_counter()
    if out.shape[1] != input_ids.shape[1] + new_tokens or len(clock.stamps) != new_tokens:
        raise RuntimeError(
            f"HF generated {out.shape[1] - input_ids.shape[1]} tokens in "
            f"{len(clock.stamps)} steps, expected {new_tokens}"
        )
    first = clock.stamps[0] - t0
    return first, end - t0 - first


def ours_generate_seconds(
    engine: LLMEngine, prompts: Sequence[Sequence[int]], new_tokens: int
) -> tuple[float, float]:
    """(seconds until every request has its first token, seconds of the rest) for one
    greedy batch of exactly `new_tokens` tokens per request."""
    device = engine.runner.device
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    _sync(device)
    t0 = time.perf_counter()
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(list(p)), params=params))
        for p in prompts
    ]
    while any(
        i in engine.requests and not engine.requests[i].seqs[0].output_token_ids for i in ids
    ):
        engine.step()
    _sync(device)
    t1 = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    _sync(device)
    return t1 - t0, time.perf_counter() - t1


def throughput_row(
    hf: Any, engine: LLMEngine, *, batch: int, prompt_len: int, new_tokens: int, seed: int
) -> dict[str, Any]:
    """Decode tokens/s of HF and of ours at one batch size (same prompts); ratio ours/HF.

    Decode time runs from the step that produced every first token to the end: N - 1
    steps of forward + pick for both. Both are warmed up first at this batch size.
    """
    prompts = gpu_engine.random_prompts(batch, prompt_len, engine.arch.vocab_size, seed)
    ids = torch.tensor(prompts, device=engine.runner.device)
    ours_generate_seconds(engine, prompts, 3)  # compiles this batch's kernel variants
    ours_first, ours_rest = ours_generate_seconds(engine, prompts, new_tokens)
    hf_generate_seconds(hf, ids, 3)
    hf_first, hf_rest = hf_generate_seconds(hf, ids, new_tokens)
    decoded = batch * (new_tokens - 1)
    ours_tps = decoded / max(ours_rest, 1e-9)
    hf_tps = decoded / max(hf_rest, 1e-9)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "ours_decode_tps": round(ours_tps, 1),
        "hf_decode_tps": round(hf_tps, 1),
        "ratio_decode": round(ours_tps / hf_tps, 3),
        "ours_total_s": round(ours_first + ours_rest, 4),
        "hf_total_s": round(hf_first + hf_rest, 4),
        "ratio_total": round((hf_first + hf_rest) / (ours_first + ours_rest), 3),
    }


@dataclass(frozen=True)
class ThroughputPlan:
    """One shape's throughput run: its batch sizes, prompt length and tokens per request."""

    shape: ModelShape
    batches: Sequence[int]
    prompt_len: int
    new_tokens: int


def throughput(
    plan: ThroughputPlan,
    device: torch.device,
    dtype: torch.dtype,
    *,
    deadline: float,
    notes: list[str],
) -> dict[str, Any]:
    """`throughput_row` per batch size while `deadline` (time.monotonic) allows; never
    raises (a failure is noted and the rows gathered so far are kept)."""
    name = plan.shape.name
    result: dict[str, Any] = {"shape": name, "dtype": str(dtype).removeprefix("torch.")}
    rows: list[dict[str, Any]] = []
    result["rows"] = rows
    try:
        _throughput_rows(plan, device, dtype, deadline=deadline, notes=notes, result=result)
    except Exception as exc:
        notes.append(f"hf peer throughput for {name} stopped: {exc!r}")
    _free(device)  # the models and the engine died with _throughput_rows' frame
    return result


def _throughput_rows(
    plan: ThroughputPlan,
    device: torch.device,
    dtype: torch.dtype,
    *,
    deadline: float,
    notes: list[str],
    result: dict[str, Any],
) -> None:
    t0 = time.perf_counter()
    prompt_len, new_tokens = plan.prompt_len, plan.new_tokens
    arch = gpu_engine.arch_from_shape(plan.shape, prompt_len + new_tokens + 64)
    model = gpu_engine.random_model(arch, dtype=dtype, device=device, seed=0)
    hf = hf_from_ours(model)
    engine = _engine(
        model,
        device,
        max_num_seqs=max(plan.batches),
        tokens_per_seq=prompt_len + new_tokens + 8,
        max_num_batched_tokens=max(2048, max(plan.batches) * prompt_len),
        name=plan.shape.name,
    )
    result["setup_s"] = round(time.perf_counter() - t0, 2)
    result["attn_implementation"] = hf.config._attn_implementation
    for batch in plan.batches:
        if time.monotonic() > deadline:
            notes.append(
                f"hf peer throughput {plan.shape.name} batch {batch} skipped (time budget)"
            )
            continue
        result["rows"].append(
            throughput_row(
                hf, engine, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens, seed=batch
            )
        )


def hf_figures(
    device: torch.device,
    dtype: torch.dtype,
    shapes: Sequence[ModelShape],
    *,
    smoke: bool,
    budget_s: float,
    notes: list[str],
) -> dict[str, Any]:
    """Parity on the first (small) shape, then throughput per shape while time is left."""
    deadline = time.monotonic() + budget_s
    result: dict[str, Any] = {"parity": None, "throughput": []}
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except Exception as exc:
        notes.append(f"hf peer skipped: transformers does not import: {exc!r}")
        return result
    try:
        steps = 6 if smoke else 32
        result["parity"] = parity(shapes[0], device, num_prompts=3 if smoke else 4, steps=steps)
    except Exception as exc:
        notes.append(f"hf peer parity failed to run: {exc!r}")
    if smoke:
        plans = [ThroughputPlan(shapes[0], [1, 2], 16, 6)]
    else:
        plans = [ThroughputPlan(shapes[0], [1, 8, 32], 512, 128)]
        plans += [ThroughputPlan(shape, [1, 8, 32], 512, 64) for shape in shapes[1:]]
    for plan in plans:
        if time.monotonic() > deadline:
            notes.append(f"hf peer throughput for {plan.shape.name} skipped (time budget)")
            continue
        result["throughput"].append(throughput(plan, device, dtype, deadline=deadline, notes=notes))
    return result


def plot(figures: dict[str, Any], png: pathlib.Path) -> None:
    """Decode tokens/s vs batch, ours vs HF, one panel per shape (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hf = figures.get("hf") or {}
    runs = [run for run in hf.get("throughput") or [] if run.get("rows")]
    if not runs:
        raise ValueError("no hf peer throughput rows to plot")
    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), squeeze=False)
    for ax, run in zip(axes[0], runs, strict=True):
        batch = [r["batch"] for r in run["rows"]]
        ax.plot(batch, [r["ours_decode_tps"] for r in run["rows"]], "o-", label="ours (engine)")
        ax.plot(batch, [r["hf_decode_tps"] for r in run["rows"]], "s--", label="HF generate")
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode tokens/s")
        ax.set_title(f"{run['shape']} {run['dtype']} on {figures.get('device', '?')}")
        ax.set_xticks(batch, [str(b) for b in batch])
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    """`--plot figures.json out.png`: the PNG of `plot` from gpu_decode.py's JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", nargs=2, type=pathlib.Path, metavar=("JSON", "PNG"))
    args = parser.parse_args(argv)
    if args.plot is None:
        parser.error("nothing to do; the figures come from bench/gpu_decode.py --parts hf")
    figures_path, png = args.plot
    plot(json.loads(figures_path.read_text().strip().splitlines()[-1]), png)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
