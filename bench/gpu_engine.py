"""End-to-end engine figures on seeded random weights in real model shapes.

No model file and no tokenizer travel to the GPU machine: the model is built with
`LlamaForCausalLM` and filled with seeded random weights, prompts are token ids, and
a stand-in tokenizer spells ids as text. `bench/gpu_decode.py` calls these:

  decode tokens/s   one prefill of the largest batch per context length, then decode
                    steps timed at each batch size, aborting requests to shrink the
                    batch (so 3.5M prompt tokens are prefilled once, not five times);
                    CUDA graphs vs eager, and the HBM bandwidth fraction of a step
                    (weight bytes + KV bytes read) / step time / peak;
  prefill tokens/s  one prompt in one step;
  bf16 parity       greedy tokens of a bf16 run on the device vs an fp32 CPU reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from bench.model_shape import ModelShape
from engine.config import ModelArchitecture
from engine.engine_builder import build_config
from engine.llm_engine import LLMEngine
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import LoadedModel
from engine.model.tokenizer import Tokenizer
from engine.request import EngineRequest
from engine.runner.cuda_graphs import pick_bucket
from engine.sampling_params import SamplingParams

BLOCK_SIZE = 16
# A flip counts as bf16 rounding when the fp32 reference itself ranks the two tokens
# within this many nats of each other at the first differing step.
ROUNDING_MARGIN_NATS = 0.25


class IdTokenizer:
    """Stand-in tokenizer for token-id prompts with ignore_eos: no vocabulary needed."""

    def __init__(self, eos_token_id: int) -> None:
        self.eos_token_ids = frozenset({eos_token_id})

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Each id as ' <id>'."""
        return "".join(f" {i}" for i in ids)


def arch_from_shape(shape: ModelShape, max_model_len: int) -> ModelArchitecture:
    """A tied-embedding Llama architecture of `shape` with the given context length."""
    return ModelArchitecture(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=max_model_len,
        tie_word_embeddings=True,
    )


@torch.no_grad()
def random_model(
    arch: ModelArchitecture,
    *,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    init_device: torch.device | None = None,
) -> LlamaForCausalLM:
    """Seeded random weights, drawn in float32 on `init_device` (same seed -> same model).

    Matrices get std 1/sqrt(fan_in); the tied embedding std hidden^-1/4, so logits have
    a spread of a few nats like a trained model's; norms 1 + 0.1 noise.
    """
    init_device = init_device or device
    model = LlamaForCausalLM.empty(arch, dtype=dtype, device=device)
    gen = torch.Generator(device=init_device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * torch.randn(param.shape, generator=gen, device=init_device)
        else:
            std = arch.hidden_size**-0.25 if "embed_tokens" in name else param.shape[-1] ** -0.5
            value = std * torch.randn(param.shape, generator=gen, device=init_device)
        param.copy_(value)
        del value
    return model


def make_engine(
    model: LlamaForCausalLM,
    *,
    name: str,
    dtype: torch.dtype,
    device: torch.device,
    num_blocks: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    attention_backend: str = "auto",
    cuda_graphs: bool = True,
    cpu_packed_linears: bool = False,
) -> LLMEngine:
    """An engine around an in-memory model; decode graphs captured on CUDA."""
    arch = model.arch
    loaded = LoadedModel(
        model=model,
        arch=arch,
        tokenizer=cast(Tokenizer, IdTokenizer(arch.vocab_size - 1)),
        revision="random",
        name=name,
    )
    config = build_config(
        None,
        dtype=dtype,
        device=str(device),
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=arch.max_position_embeddings,
        prefix_cache="off",
        attention_backend=attention_backend,
        enforce_eager=not cuda_graphs,
        cpu_packed_linears=cpu_packed_linears,
    )
    engine = LLMEngine(config, loaded)
    if device.type == "cuda" and cuda_graphs and engine.runner.graphs is None:
        engine.runner.capture_decode_graphs(max_num_seqs, engine.max_model_len)
    return engine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """`count` seeded random prompts of `length` ids, never 0 nor the stand-in EOS."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab - 1, (count, length), generator=gen).tolist()


def ragged_prompts(
    count: int, below: int, vocab: int, seed: int
) -> tuple[list[int], list[list[int]]]:
    """The parity checks' inputs: `count` seeded lengths in [4, `below`) and a seeded
    random prompt of each (`random_prompts`, seed + its index)."""
    gen = torch.Generator().manual_seed(seed)
    lens: list[int] = torch.randint(4, below, (count,), generator=gen).tolist()
    return lens, [random_prompts(1, n, vocab, seed + i)[0] for i, n in enumerate(lens)]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct parameter (a tied matrix once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True)
class DecodeCase:
    """Steps per measurement: warm-up, graph-replayed and eager."""

    warmup: int = 3
    measured: int = 12
    eager: int = 4

    @property
    def total(self) -> int:
        """Decode steps one batch size consumes."""
        return self.warmup + self.measured + self.eager


def _time_steps(engine: LLMEngine, steps: int, device: torch.device) -> float:
    """Seconds per engine step over `steps` steps."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync(device)
    return (time.perf_counter() - t0) / max(steps, 1)


def context_margin(batch: int, context: int, max_num_batched_tokens: int) -> int:
    """Tokens an early-prefilled sequence may decode while the rest of its batch prefills."""
    return 2 * -(-batch * context // max_num_batched_tokens) + 16


def _replay_seconds(engine: LLMEngine, batch: int, iters: int) -> float | None:
    """Seconds per replay of the decode graph the last step of `batch` rows used."""
    graphs = engine.runner.graphs
    bucket = None if graphs is None else pick_bucket(graphs.captured_sizes, batch)
    if graphs is None or bucket is None:
        return None
    graphs.replay(bucket)
    start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    for _ in range(iters):
        graphs.replay(bucket)
    end.record()
    torch.cuda.synchronize(engine.runner.device)
    return float(start.elapsed_time(end)) / 1e3 / max(iters, 1)


def decode_sweep(
    engine: LLMEngine,
    *,
    context: int,
    batches: Sequence[int],
    case: DecodeCase,
    peak_tbps: float,
    seed: int,
) -> list[dict[str, Any]]:
    """Prefills max(batches) prompts of about `context` tokens once, then times decode
    at each batch size, largest first, aborting requests to shrink the batch."""
    device = engine.runner.device
    arch = engine.arch
    sizes = sorted(batches, reverse=True)
    budget = case.total * len(sizes) + 2
    prompt_len = context - budget
    if prompt_len < 1:
        raise ValueError(f"context {context} is too short for {budget} decode steps")
    # Sequences prefilled early decode while the rest prefill, so they may use up to
    # the whole context left: no request may finish before the sweep ends.
    max_tokens = engine.max_model_len - prompt_len
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(sizes[0], prompt_len, arch.vocab_size, seed)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=params)) for p in prompts
    ]
    t0 = time.perf_counter()
    while any(not engine.requests[i].seqs[0].output_token_ids for i in ids):
        engine.step()
    _sync(device)
    prefill_s = time.perf_counter() - t0
    kv_elem = engine.runner.kv_caches[0].element_size()
    kv_per_token = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * kv_elem
    w_bytes = weight_bytes(engine.runner.model)
    peak = peak_tbps * 1e12
    rows = []
    for batch in sizes:
        for request_id in ids[batch:]:
            if request_id in engine.requests:
                engine.abort(request_id)
        live = ids[:batch]
        for _ in range(case.warmup):
            engine.step()
        ctx_total = sum(engine.requests[i].seqs[0].num_tokens for i in live)
        graph_s = _time_steps(engine, case.measured, device)
        forward_s = _replay_seconds(engine, batch, case.measured)
        graphs, engine.runner.graphs = engine.runner.graphs, None
        eager_s = _time_steps(engine, case.eager, device)
        engine.runner.graphs = graphs
        if any(i not in engine.requests for i in live):
            raise RuntimeError("a request finished during the sweep; raise max_model_len")
        step_bytes = w_bytes + (ctx_total + batch * case.measured // 2) * kv_per_token
        rows.append(
            {
                "batch": batch,
                "context": context,
                "mean_context": round(ctx_total / batch + case.measured / 2, 1),
                "step_ms": round(graph_s * 1e3, 3),
                "tokens_per_s": round(batch / graph_s, 1),
                "eager_step_ms": round(eager_s * 1e3, 3),
                "eager_tokens_per_s": round(batch / eager_s, 1),
                "graphs": graphs is not None,
                "bytes_per_step": step_bytes,
                "hbm_tbps": round(step_bytes / graph_s / 1e12, 4),
                "hbm_fraction": round(step_bytes / graph_s / peak, 4),
                # The captured forward alone (no host work, no logits, no sampling).
                "forward_ms": None if forward_s is None else round(forward_s * 1e3, 3),
                "forward_hbm_fraction": (
                    None if forward_s is None else round(step_bytes / forward_s / peak, 4)
                ),
                "prefill_s_all": round(prefill_s, 3),
            }
        )
    for request_id in ids:
        if request_id in engine.requests:
            engine.abort(request_id)
    return rows


def prefill_throughput(engine: LLMEngine, tokens: int, *, seed: int) -> dict[str, Any]:
    """Tokens/s of one `tokens`-token prompt prefilled in a single step (after a warm-up)."""
    device = engine.runner.device
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    times = []
    for attempt in range(2):  # the first compiles the prefill kernels at this size
        (prompt,) = random_prompts(1, tokens, engine.arch.vocab_size, seed + attempt)
        engine.add_request(EngineRequest(prompt_token_ids=tuple(prompt), params=params))
        _sync(device)
        t0 = time.perf_counter()
        steps = 0
        while engine.has_unfinished():
            engine.step()
            steps += 1
        _sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "tokens": tokens,
        "steps": steps,
        "seconds": round(times[-1], 4),
        "tokens_per_s": round(tokens / times[-1], 1),
    }


def greedy_run(
    engine: LLMEngine, prompts: Sequence[Sequence[int]], steps: int
) -> list[tuple[list[int], list[dict[int, float]]]]:
    """Per prompt: greedy tokens and, per step, {token id: logprob} of the top 5."""
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=5)
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(list(p)), params=params))
        for p in prompts
    ]
    done: dict[str, Any] = {}
    while engine.has_unfinished():
        engine.step()
    engine_finished = getattr(engine, "finished", {})
    for request_id in ids:
        done[request_id] = engine_finished.pop(request_id).to_output().outputs[0]
    result = []
    for request_id in ids:
        out = done[request_id]
        tops = [{t.token_id: t.logprob for t in pos.top} for pos in out.logprobs or []]
        result.append((list(out.token_ids), tops))
    return result


def bf16_parity(
    shape: ModelShape,
    device: torch.device,
    *,
    num_prompts: int = 8,
    steps: int = 16,
    seed: int = 1234,
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Any]:
    """Greedy tokens of `dtype` on `device` vs float32 on the CPU, same random weights."""
    arch = arch_from_shape(shape, 512)
    cpu = torch.device("cpu")
    lens, prompts = ragged_prompts(num_prompts, 48, arch.vocab_size, seed)
    blocks = num_prompts * -(-(max(lens) + steps) // BLOCK_SIZE) + 8

    def run(run_dtype: torch.dtype, run_device: torch.device, backend: str) -> Any:
        model = random_model(arch, dtype=run_dtype, device=run_device, seed=seed, init_device=cpu)
        engine = make_engine(
            model,
            name=shape.name,
            dtype=run_dtype,
            device=run_device,
            num_blocks=blocks,
            max_num_seqs=num_prompts,
            max_num_batched_tokens=2048,
            attention_backend=backend,
        )
        engine.keep_finished = True
        return greedy_run(engine, prompts, steps)

    ref = run(torch.float32, cpu, "torch")
    got = run(dtype, device, "auto")
    summary = compare_greedy(ref, got, lens)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "steps": steps,
        **summary,
    }


def compare_greedy(
    ref: Sequence[tuple[list[int], list[dict[int, float]]]],
    got: Sequence[tuple[list[int], list[dict[int, float]]]],
    prompt_lens: Sequence[int],
) -> dict[str, Any]:
    """Per prompt, the first step where `got` leaves `ref`'s greedy tokens, and whether
    that flip is within rounding: `ref` itself ranked the two tokens within
    ROUNDING_MARGIN_NATS (both `greedy_run`'s format: tokens, top-5 logprobs per step)."""
    rows = []
    for i, ((ref_ids, ref_top), (got_ids, got_top)) in enumerate(zip(ref, got, strict=True)):
        first = next(
            (s for s, (a, b) in enumerate(zip(ref_ids, got_ids, strict=True)) if a != b), None
        )
        row: dict[str, Any] = {"prompt": i, "prompt_len": prompt_lens[i], "first_diff": first}
        if first is not None:
            a, b = ref_ids[first], got_ids[first]
            ref_lp, got_lp = ref_top[first], got_top[first]
            # Logprob gaps equal logit gaps (same normaliser within one distribution).
            floor_ref = min(ref_lp.values())
            row["ref_margin"] = ref_lp[a] - ref_lp.get(b, floor_ref)
            row["ref_margin_is_lower_bound"] = b not in ref_lp
            row["dtype_margin"] = got_lp[b] - got_lp.get(a, min(got_lp.values()))
            row["explained_by_rounding"] = b in ref_lp and row["ref_margin"] < ROUNDING_MARGIN_NATS
        rows.append(row)
    identical = sum(r["first_diff"] is None for r in rows)
    explained = sum(bool(r.get("explained_by_rounding")) for r in rows)
    return {
        "prompts": rows,
        "identical": identical,
        "explained": explained,
        "passed": identical + explained == len(rows),
        "rounding_margin_nats": ROUNDING_MARGIN_NATS,
    }
