"""Attention kernel benchmark for a CUDA machine: triton decode/prefill vs torch SDPA.

Measures, with seeded random K/V in real model shapes (SmolLM2-135M and a
Llama-3-8B attention layer), at batch 1/8/32/128/256 and contexts 1k/8k:

  (a) decode attention kernel time vs torch scaled_dot_product_attention, both on
      K/V gathered through the block tables first (what the torch backend does) and
      on pre-gathered K/V (SDPA's best case); printed as speed-up ratios;
  (b) achieved HBM bandwidth of the decode kernel (K/V bytes read / time) as a
      fraction of the device's peak (--peak-tbps, default H200: 4.8 TB/s);
  (c) prefill attention tokens/s for an 8k-token prompt (and SDPA causal for scale).

and, through the engine itself (bench/gpu_engine.py, seeded random weights):

  (d) bf16 greedy parity on the device against the fp32 CPU reference (SmolLM2 shape);
  (e) end-to-end decode tokens/s at batch 1/8/32/128/256 with 1k and 8k contexts
      (CUDA graphs and eager), the HBM bandwidth fraction of a decode step, and
      prefill tokens/s of one 8k prompt; SmolLM2 first, then Llama-3-8B while the
      time budget (--engine-budget-s) lasts;

and against the peer, Hugging Face transformers on the same weights (bench/hf_peer.py):

  (f) greedy parity ours vs HF (fp32, and bf16 on CUDA) and triton vs torch backend;
  (g) decode tokens/s of HF generate vs our engine at batch 1/8/32, ratio ours/HF
      (SmolLM2 shape, then Llama-3-8B while --hf-budget-s lasts).

It prints tables; the last line is JSON (--json-out is rewritten after every part, so
a run killed part-way keeps what it measured). `--smoke` runs tiny sizes so that the
script can be checked on a CPU under TRITON_INTERPRET=1. `--parts` picks a subset;
they run in the order kernels, parity, hf, engine.

    python bench/gpu_decode.py [--peak-tbps 4.8] [--dtype bfloat16] [--json-out F]
    python bench/gpu_decode.py --parts parity,engine --engine-budget-s 150
    python bench/gpu_decode.py --parts hf --hf-budget-s 90
    TRITON_INTERPRET=1 python bench/gpu_decode.py --smoke
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench.model_shape import ModelShape  # noqa: E402
from engine.kernels.common import num_sms  # noqa: E402
from engine.kernels.decode_attention import choose_num_splits, decode_attention  # noqa: E402
from engine.kernels.prefill_attention import prefill_attention  # noqa: E402

SMOLLM2_135M = ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152)
LLAMA3_8B = ModelShape("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256)
TINY_SHAPE = ModelShape("tiny", 2, 64, 4, 2, 16, 128, 512)  # --smoke engine runs
BLOCK_SIZE = 16
# Seconds --wall-budget-s keeps back: one engine sweep or HF row may run past a deadline.
WALL_RESERVE_S = 45.0


@dataclass(frozen=True)
class DecodeCase:
    """One layer's decode inputs: every sequence has `ctx` tokens in a shuffled block pool."""

    q: torch.Tensor  # [batch, heads, head_dim]
    kv_cache: torch.Tensor  # [2, blocks, BLOCK_SIZE, kv_heads, head_dim]
    block_tables: torch.Tensor  # int32 [batch, ctx / BLOCK_SIZE]
    seq_lens: torch.Tensor  # int32 [batch]


def make_decode_case(
    shape: ModelShape, batch: int, ctx: int, dtype: torch.dtype, device: torch.device, seed: int
) -> DecodeCase:
    """Seeded random q and K/V; block tables are a random permutation of the pool."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-ctx // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    cache = torch.randn(
        2,
        num_blocks,
        BLOCK_SIZE,
        shape.num_kv_heads,
        shape.head_dim,
        generator=gen,
        device=device,
        dtype=dtype,
    )
    perm = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32)
    q = torch.randn(
        batch, shape.num_heads, shape.head_dim, generator=gen, device=device, dtype=dtype
    )
    return DecodeCase(
        q=q,
        kv_cache=cache,
        block_tables=perm.view(batch, blocks_per_seq),
        seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
    )


def time_ms(
    fn: Callable[[], object], device: torch.device, budget_s: float, max_iters: int
) -> float:
    """Mean milliseconds per call after a warm-up (CUDA events on the GPU)."""
    fn()  # compile and warm caches
    if device.type == "cuda":
        torch.cuda.synchronize()
        probe_start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        once = max(time.perf_counter() - probe_start, 1e-6)
        iters = int(max(3, min(max_iters, budget_s / once)))
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / iters
    iters = 2
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1000.0 / iters


def gather_kv_batch(case: DecodeCase) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of every sequence, [batch, kv_heads, ctx, head_dim], via the block tables."""
    batch, nblk = case.block_tables.shape
    ctx = int(case.seq_lens[0])  # every sequence of a case has the same length
    tables = case.block_tables.long()
    k = case.kv_cache[0][tables].reshape(batch, nblk * BLOCK_SIZE, *case.kv_cache.shape[3:])
    v = case.kv_cache[1][tables].reshape(batch, nblk * BLOCK_SIZE, *case.kv_cache.shape[3:])
    return k[:, :ctx].transpose(1, 2), v[:, :ctx].transpose(1, 2)


def sdpa_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool
) -> torch.Tensor:
    """SDPA with grouped KV heads (enable_gqa where torch has it, else repeated heads)."""
    try:
        return F.scaled_dot_product_attention(
            q, k, v, scale=scale, is_causal=causal, enable_gqa=True
        )
    except TypeError:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal)


def bench_decode(
    shape: ModelShape,
    batch: int,
    ctx: int,
    dtype: torch.dtype,
    device: torch.device,
    peak_tbps: float,
    budget_s: float,
) -> dict[str, Any]:
    """One (shape, batch, context) decode row: times, ratios, bandwidth, max error."""
    case = make_decode_case(shape, batch, ctx, dtype, device, seed=batch * 7919 + ctx)
    scale = shape.head_dim**-0.5
    out = torch.empty_like(case.q)

    def triton_decode() -> object:
        return decode_attention(
            case.q, case.kv_cache, case.block_tables, case.seq_lens, scale, ctx, out=out
        )

    def gather_then_sdpa() -> torch.Tensor:
        k, v = gather_kv_batch(case)
        return sdpa_gqa(case.q.unsqueeze(2), k, v, scale, causal=False)

    k_g, v_g = gather_kv_batch(case)
    k_g, v_g = k_g.contiguous(), v_g.contiguous()

    def sdpa_only() -> torch.Tensor:
        return sdpa_gqa(case.q.unsqueeze(2), k_g, v_g, scale, causal=False)

    t_triton = time_ms(triton_decode, device, budget_s, 200)
    t_gather = time_ms(gather_then_sdpa, device, budget_s, 100)
    t_sdpa = time_ms(sdpa_only, device, budget_s, 100)
    ref = sdpa_only().squeeze(2)
    triton_decode()
    err = float((out.float() - ref.float()).abs().max())
    kv_bytes = 2 * batch * ctx * shape.num_kv_heads * shape.head_dim * case.kv_cache.element_size()
    tbps = kv_bytes / (t_triton * 1e-3) / 1e12
    splits = choose_num_splits(ctx, batch * shape.num_kv_heads, num_sms(device))
    return {
        "shape": shape.name,
        "batch": batch,
        "ctx": ctx,
        "num_splits": splits,
        "triton_ms": round(t_triton, 4),
        "gather_sdpa_ms": round(t_gather, 4),
        "sdpa_ms": round(t_sdpa, 4),
        "speedup_vs_gather_sdpa": round(t_gather / t_triton, 3),
        "speedup_vs_sdpa": round(t_sdpa / t_triton, 3),
        "kv_tbps": round(tbps, 4),
        "peak_fraction": round(tbps / peak_tbps, 4),
        "max_abs_err": err,
    }


def bench_prefill(
    shape: ModelShape, tokens: int, dtype: torch.dtype, device: torch.device, budget_s: float
) -> dict[str, Any]:
    """One fresh prompt of `tokens` tokens through the paged prefill kernel, vs SDPA causal."""
    case = make_decode_case(shape, 1, tokens, dtype, device, seed=tokens)
    gen = torch.Generator(device=device).manual_seed(tokens + 1)
    q = torch.randn(
        tokens, shape.num_heads, shape.head_dim, generator=gen, device=device, dtype=dtype
    )
    qsl = torch.tensor([0, tokens], dtype=torch.int32, device=device)
    scale = shape.head_dim**-0.5
    out = torch.empty_like(q)

    def triton_prefill() -> object:
        return prefill_attention(
            q, case.kv_cache, case.block_tables, qsl, case.seq_lens, scale, tokens, out=out
        )

    k_g, v_g = (t.contiguous() for t in gather_kv_batch(case))
    q_b = q.transpose(0, 1).unsqueeze(0)

    def sdpa_causal() -> torch.Tensor:
        return sdpa_gqa(q_b, k_g, v_g, scale, causal=True)

    t_triton = time_ms(triton_prefill, device, budget_s, 50)
    t_sdpa = time_ms(sdpa_causal, device, budget_s, 50)
    triton_prefill()
    err = float((out.float() - sdpa_causal().squeeze(0).transpose(0, 1).float()).abs().max())
    return {
        "shape": shape.name,
        "tokens": tokens,
        "triton_ms": round(t_triton, 4),
        "sdpa_causal_ms": round(t_sdpa, 4),
        "triton_tokens_per_s": round(tokens / (t_triton * 1e-3), 1),
        "sdpa_tokens_per_s": round(tokens / (t_sdpa * 1e-3), 1),
        "max_abs_err": err,
    }


def bench_engine_decode(
    shape: ModelShape,
    plan: Sequence[tuple[int, Sequence[int]]],
    dtype: torch.dtype,
    device: torch.device,
    peak_tbps: float,
    notes: list[str],
    *,
    deadline: float,
    prefill_tokens: int | None,
    max_num_batched_tokens: int = 32768,
) -> dict[str, Any] | None:
    """End-to-end engine decode tokens/s for `plan` [(context, batches)], then prefill.

    One engine per shape (random weights, decode graphs on CUDA). Each context's sweep
    runs only while `deadline` (time.monotonic) leaves room; what is skipped is noted.
    Never raises: a failure becomes a note, and the figures gathered so far are kept.
    """
    try:
        gpu_engine = importlib.import_module("bench.gpu_engine")
    except Exception as exc:  # e.g. a model-format package missing on the GPU image
        notes.append(f"engine figures skipped for {shape.name}: {exc!r}")
        return None
    result: dict[str, Any] = {"shape": shape.name, "decode": [], "prefill": None}
    try:
        longest = max(ctx for ctx, _ in plan)
        margin = max(gpu_engine.context_margin(max(b), c, max_num_batched_tokens) for c, b in plan)
        step_budget = gpu_engine.DecodeCase().total * max(len(b) for _, b in plan) + 2
        max_model_len = max(longest + margin, (prefill_tokens or 0) + 8)
        blocks = max(max(b) * -(-(c + margin) // BLOCK_SIZE) for c, b in plan)
        t0 = time.perf_counter()
        model = gpu_engine.random_model(
            gpu_engine.arch_from_shape(shape, max_model_len), dtype=dtype, device=device, seed=0
        )
        engine = gpu_engine.make_engine(
            model,
            name=shape.name,
            dtype=dtype,
            device=device,
            num_blocks=blocks + 16,
            max_num_seqs=max(max(b) for _, b in plan),
            max_num_batched_tokens=max(max_num_batched_tokens, prefill_tokens or 0),
        )
        result["setup_s"] = round(time.perf_counter() - t0, 2)
        result["captured_sizes"] = (
            list(engine.runner.graphs.captured_sizes) if engine.runner.graphs else []
        )
        result["weight_bytes"] = gpu_engine.weight_bytes(model)
        for context, batches in plan:
            if time.monotonic() > deadline:
                notes.append(f"{shape.name}: decode at context {context} skipped (time budget)")
                continue
            result["decode"] += gpu_engine.decode_sweep(
                engine,
                context=max(context, step_budget + 1),
                batches=batches,
                case=gpu_engine.DecodeCase(),
                peak_tbps=peak_tbps,
                seed=context,
            )
        if prefill_tokens and time.monotonic() < deadline:
            result["prefill"] = gpu_engine.prefill_throughput(engine, prefill_tokens, seed=7)
        elif prefill_tokens:
            notes.append(f"{shape.name}: prefill at {prefill_tokens} skipped (time budget)")
    except Exception as exc:  # keep what was measured; report the failure
        notes.append(f"engine figures for {shape.name} stopped: {exc!r}")
    return result


def bench_parity(device: torch.device, notes: list[str], *, smoke: bool) -> dict[str, Any] | None:
    """bf16 greedy parity on the device against the fp32 CPU reference (random weights)."""
    try:
        gpu_engine = importlib.import_module("bench.gpu_engine")
        shape = TINY_SHAPE if smoke else SMOLLM2_135M
        return dict(
            gpu_engine.bf16_parity(shape, device, num_prompts=8, steps=16 if not smoke else 6)
        )
    except Exception as exc:
        notes.append(f"bf16 parity failed to run: {exc!r}")
        return None


def hf_peer_figures(
    dtype: torch.dtype,
    device: torch.device,
    args: argparse.Namespace,
    notes: list[str],
) -> dict[str, Any] | None:
    """(f) and (g): the HF transformers peer (bench/hf_peer.py); never raises."""
    try:
        hf_peer = importlib.import_module("bench.hf_peer")
    except Exception as exc:  # e.g. transformers or a model-format package missing
        notes.append(f"hf peer skipped: {exc!r}")
        return None
    shapes = [TINY_SHAPE] if args.smoke else [SMOLLM2_135M, LLAMA3_8B]
    figures: dict[str, Any] = hf_peer.hf_figures(
        device, dtype, shapes, smoke=args.smoke, budget_s=args.hf_budget_s, notes=notes
    )
    parity = figures.get("parity")
    if parity is not None:
        for name, comparison in parity["comparisons"].items():
            flips = [(r["prompt"], r["first_diff"]) for r in comparison["prompts"]]
            print(
                f"# hf peer parity {parity['shape']} {name}: identical "
                f"{comparison['identical']}/{len(flips)}, explained by rounding "
                f"{comparison['explained']}, passed {comparison['passed']}, "
                f"(prompt, first diff) {flips}"
            )
    for run in figures.get("throughput", []):
        if run["rows"]:
            print(f"# decode tokens/s, ours vs HF generate, {run['shape']}, {run['dtype']}")
            _print_table(run["rows"], list(run["rows"][0]))
            for row in run["rows"]:
                print(
                    f"# ratio ours/HF decode tokens/s {run['shape']} batch {row['batch']}: "
                    f"{row['ratio_decode']}x ({row['ours_decode_tps']} vs {row['hf_decode_tps']})"
                )
    return figures


def _print_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).rjust(w) for c, w in zip(columns, widths, strict=True)))


def kernel_figures(
    batches: Sequence[int],
    contexts: Sequence[int],
    prefill_tokens: int,
    dtype: torch.dtype,
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """(a)-(c) of the module docstring: one attention layer, triton vs SDPA."""
    decode_rows = []
    for shape in (SMOLLM2_135M, LLAMA3_8B):
        for ctx in contexts:
            for batch in batches:
                decode_rows.append(
                    bench_decode(shape, batch, ctx, dtype, device, args.peak_tbps, args.budget_s)
                )
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    print(f"# decode attention, one layer, {dtype}, block_size {BLOCK_SIZE}, device {device}")
    _print_table(decode_rows, list(decode_rows[0]))
    prefill_rows = [
        bench_prefill(s, prefill_tokens, dtype, device, args.budget_s)
        for s in (SMOLLM2_135M, LLAMA3_8B)
    ]
    print(f"# prefill attention, one layer, one {prefill_tokens}-token prompt")
    _print_table(prefill_rows, list(prefill_rows[0]))
    return {"decode": decode_rows, "prefill": prefill_rows}


def engine_figures(
    dtype: torch.dtype,
    device: torch.device,
    args: argparse.Namespace,
    notes: list[str],
    checkpoint: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """End-to-end engine decode/prefill: SmolLM2 first, then Llama-3-8B while time is left.

    `checkpoint` gets the figures so far after each shape (to save them as they come).
    """
    deadline = time.monotonic() + args.engine_budget_s
    if args.smoke:
        runs = [(TINY_SHAPE, [(64, [1, 2, 4]), (128, [1, 3])], 64)]
    else:
        smol = [(1024, [1, 8, 32, 128, 256]), (8192, [1, 8, 32, 128, 256])]
        # 8B KV is 128 KiB/token: batch 256 at 8k would need 275 GB, so 8k stops at 32.
        llama = [(1024, [1, 8, 32, 128, 256]), (8192, [1, 8, 32])]
        runs = [(SMOLLM2_135M, smol, 8192), (LLAMA3_8B, llama, 8192)]
    results = []
    for shape, plan, prefill_tokens in runs:
        if time.monotonic() > deadline:
            notes.append(f"engine figures for {shape.name} skipped (time budget)")
            continue
        figures = bench_engine_decode(
            shape,
            plan,
            dtype,
            device,
            args.peak_tbps,
            notes,
            deadline=deadline,
            prefill_tokens=prefill_tokens,
        )
        if figures is not None:
            results.append(figures)
            if checkpoint is not None:
                checkpoint(results)
            if figures["decode"]:
                print(f"# engine decode, {shape.name}, {dtype}, random weights")
                _print_table(figures["decode"], list(figures["decode"][0]))
            print(f"# engine prefill, {shape.name}: {figures['prefill']}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Runs the benchmark and prints the tables and the JSON line; returns the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (CPU / interpreter check)")
    parser.add_argument("--peak-tbps", type=float, default=4.8, help="device HBM peak, TB/s")
    parser.add_argument("--dtype", default=None, help="bfloat16 (CUDA default) / float16 / float32")
    parser.add_argument(
        "--budget-s", type=float, default=0.25, help="timing budget per measurement"
    )
    parser.add_argument(
        "--parts",
        default="kernels,parity,hf,engine",
        help="comma list of kernels, parity, hf, engine",
    )
    parser.add_argument(
        "--engine-budget-s", type=float, default=240.0, help="wall-clock cap of the engine part"
    )
    parser.add_argument(
        "--hf-budget-s", type=float, default=100.0, help="wall-clock cap of the hf peer part"
    )
    parser.add_argument(
        "--wall-budget-s",
        type=float,
        default=None,
        help="whole-run cap: the hf and engine parts start no new work after it, less "
        f"{WALL_RESERVE_S:.0f} s kept for the step then running",
    )
    parser.add_argument("--json-out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    started = time.monotonic()

    def capped(part_budget_s: float) -> float:
        """A part's budget, cut to what the whole-run budget still leaves."""
        if args.wall_budget_s is None:
            return part_budget_s
        left = float(args.wall_budget_s) - (time.monotonic() - started) - WALL_RESERVE_S
        return max(0.0, min(part_budget_s, left))

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    default_dtype = "bfloat16" if device.type == "cuda" else "float32"
    dtype = getattr(torch, args.dtype or default_dtype)
    if args.smoke:
        batches, contexts, prefill_tokens = [1, 2], [40, 72], 48
    else:
        batches, contexts, prefill_tokens = [1, 8, 32, 128, 256], [1024, 8192], 8192
    notes: list[str] = []
    if device.type != "cuda" and not args.smoke:
        notes.append("no CUDA device: full-size figures are meaningless here; use --smoke")

    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": importlib.import_module("triton").__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "smoke": args.smoke,
        "peak_tbps": args.peak_tbps,
        "models": [asdict(SMOLLM2_135M), asdict(LLAMA3_8B)],
        "notes": notes,
    }
    unknown = parts - {"kernels", "parity", "hf", "engine"}
    if unknown:
        parser.error(f"unknown parts: {sorted(unknown)}")

    def save() -> str:
        line = json.dumps(result)
        if args.json_out is not None:
            args.json_out.write_text(line + "\n")
        return line

    if "kernels" in parts:
        result.update(kernel_figures(batches, contexts, prefill_tokens, dtype, device, args))
        save()
    if "parity" in parts:
        result["parity"] = bench_parity(device, notes, smoke=args.smoke)
        print(f"# bf16 parity vs fp32 CPU: {result['parity']}")
        save()
    if "hf" in parts:
        hf_args = argparse.Namespace(**{**vars(args), "hf_budget_s": capped(args.hf_budget_s)})
        result["hf"] = hf_peer_figures(dtype, device, hf_args, notes)
        save()
    if "engine" in parts:

        def checkpoint(figures: list[dict[str, Any]]) -> None:
            result["engine"] = figures
            save()

        budget = capped(args.engine_budget_s)
        engine_args = argparse.Namespace(**{**vars(args), "engine_budget_s": budget})
        result["engine"] = engine_figures(dtype, device, engine_args, notes, checkpoint)
    for note in notes:
        print(f"# note: {note}")
    print(save())
    return result


def exit_status(result: dict[str, Any]) -> int:
    """1 when a parity check failed or an engine run broke off; kernel figures never fail it."""
    parity_failed = "parity" in result and not (result["parity"] or {}).get("passed")
    hf_parity = (result.get("hf") or {}).get("parity") or {}
    parity_failed = parity_failed or ("hf" in result and not hf_parity.get("passed"))
    engine_broke = any("stopped:" in note or "failed" in note for note in result["notes"])
    return int(parity_failed or engine_broke)


if __name__ == "__main__":
    sys.exit(exit_status(main()))
