"""Decode speed per model family on the CPU, against Hugging Face transformers.

For every family in engine.model.registry, transformers builds a model of that family
from its config (offline) with seeded random weights; our engine loads the very same
tensors through the family's own weight mapping. Both decode the same token-id prompts
greedily (EOS held off) at each batch size, and the ratio of decode tokens/s (ours /
transformers) is printed. Goal (issue 39): at least 1.5x at batch 8 for every family.

    python bench/model_families.py                      # the default shape, batches 1 and 8
    python bench/model_families.py --no-cpu-packed-linears   # our side without packed weights
    python bench/model_families.py --families qwen3,phi3 --plot families.png

The last line is the JSON report.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "platform"))

from bench import gpu_engine  # noqa: E402
from bench.hf_peer import throughput_row  # noqa: E402
from engine.model.hf_loader import architecture_from_config  # noqa: E402
from engine.model.llama import LlamaForCausalLM  # noqa: E402
from engine.model.registry import FAMILIES, family_named  # noqa: E402
from server.settings import EngineSettings  # noqa: E402
from tests.utils.hf_families import TINY_SHAPE  # noqa: E402

GOAL = 1.5  # ours / transformers, decode tokens/s at batch 8
# What a shape sets; every other config field is the family's own default.
SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
SHAPES: dict[str, dict[str, int]] = {
    # About a quarter of SmolLM2-360M: big enough that the matrices, not Python, dominate.
    "small": {
        "vocab_size": 32000,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
    },
    # For the test suite: seconds, not minutes. The test models' dimensions, with a
    # vocabulary of 512 (theirs is SmolLM2's, and its tokenizer is not needed here).
    "tiny": {**{field: TINY_SHAPE[field] for field in SHAPE_FIELDS}, "vocab_size": 512},
}


# The mixture-of-experts families' own fields, scaled to the shapes above (Mixtral's
# 8 experts, top 2; Qwen3-MoE's many narrow experts, fewer than its 128, top 4).
MOE_FIELDS: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 16, "num_experts_per_tok": 4, "norm_topk_prob": True},
}


def hf_model(family: str, shape: dict[str, int], seed: int) -> Any:
    """transformers' model of `family` at `shape`, seeded weights, eval mode, fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_arch = family_named(family).hf_architectures[0]
    model_type = {"gemma3": "gemma3_text"}.get(family, family)  # the text-only Gemma 3
    config = AutoConfig.for_model(
        model_type,
        architectures=[hf_arch],
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        # No window binds at these lengths (the Gemmas' layer patterns need one set).
        sliding_window=4096 if family in ("gemma2", "gemma3") else None,
        eos_token_id=shape["vocab_size"] - 1,
        pad_token_id=shape["vocab_size"] - 1,
        **shape,
        **MOE_FIELDS.get(family, {}),
        **(
            {"moe_intermediate_size": shape["intermediate_size"] // 4}
            if family == "qwen3_moe"
            else {}
        ),
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
            else:
                std = shape["hidden_size"] ** -0.25 if "embed" in name else param.shape[-1] ** -0.5
                param.copy_(std * torch.randn(param.shape, generator=gen))
    return model.eval()


def ours_from(hf: Any) -> LlamaForCausalLM:
    """Our decoder on the same tensors, through the family's own weight mapping."""
    arch = architecture_from_config(hf.config.to_dict())
    mapper = family_named(arch.architecture).hf_weights
    model = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="cpu")
    model.load_weights(
        pair for name, tensor in hf.state_dict().items() for pair in mapper(name, tensor, arch)
    )
    return model


def measure(
    family: str,
    shape: dict[str, int],
    batches: Sequence[int],
    *,
    prompt_len: int,
    new_tokens: int,
    seed: int,
    packed: bool = False,
) -> list[dict[str, Any]]:
    """One throughput row per batch size for `family` (ours vs transformers)."""
    hf = hf_model(family, shape, seed)
    model = ours_from(hf)
    blocks = max(batches) * -(-(prompt_len + new_tokens) // gpu_engine.BLOCK_SIZE) + 8
    engine = gpu_engine.make_engine(
        model,
        name=family,
        dtype=torch.float32,
        device=torch.device("cpu"),
        num_blocks=blocks,
        max_num_seqs=max(batches),
        max_num_batched_tokens=max(batches) * prompt_len,
        cuda_graphs=False,
        cpu_packed_linears=packed,
    )
    return [
        throughput_row(hf, engine, batch=b, prompt_len=prompt_len, new_tokens=new_tokens, seed=seed)
        for b in batches
    ]


def _int_list(p: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        p.error(f"{flag}: {text!r} is not a comma-separated list of whole numbers")
    if min(values) < 1 or max(values) > 64:
        p.error(f"{flag}: every value must be between 1 and 64")
    return values


def plot(report: dict[str, Any], png: pathlib.Path) -> None:
    """Bars of ours/transformers per family and batch, with the goal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(report["families"])
    batches = report["batches"]
    fig, ax = plt.subplots(figsize=(1.6 * len(families) + 2, 3.5))
    width = 0.8 / len(batches)
    for i, b in enumerate(batches):
        ratios = [report["families"][f][str(b)]["ratio_decode"] for f in families]
        xs = [x + i * width for x in range(len(families))]
        ax.bar(xs, ratios, width, label=f"batch {b}")
    ax.axhline(GOAL, color="black", linestyle="--", linewidth=1, label=f"goal {GOAL}x")
    ax.set_xticks([x + width * (len(batches) - 1) / 2 for x in range(len(families))])
    ax.set_xticklabels(families)
    ax.set_ylabel("decode tokens/s, ours / transformers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measures every family; prints the table, then the JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(f.name for f in FAMILIES))
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--cpu-packed-linears",
        action=argparse.BooleanOptionalAction,
        # Our side as `cloister serve` runs it unless told otherwise.
        default=EngineSettings.model_fields["cpu_packed_linears"].default,
        help="our side with oneDNN-packed fp32 weights (CLOISTER_CPU_PACKED_LINEARS; "
        "default: serve's default)",
    )
    p.add_argument("--plot", type=pathlib.Path, default=None, help="write a PNG of the ratios")
    args = p.parse_args(argv)
    known = [f.name for f in FAMILIES]
    families = args.families.split(",")
    unknown = [f for f in families if f not in known]
    if unknown:
        p.error(f"--families: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    batches = _int_list(p, "--batches", args.batches)
    for flag, value, least in (
        ("--prompt-tokens", args.prompt_tokens, 1),
        ("--new-tokens", args.new_tokens, 2),
    ):
        if not least <= value <= 1024:
            p.error(f"{flag}: must be between {least} and 1024, not {value}")
    if args.threads is not None and not 1 <= args.threads <= 256:
        p.error(f"--threads: must be between 1 and 256, not {args.threads}")
    threads = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, Any]] = {}
    try:
        for family in families:
            rows = measure(
                family,
                SHAPES[args.shape],
                batches,
                prompt_len=args.prompt_tokens,
                new_tokens=args.new_tokens,
                seed=args.seed,
                packed=args.cpu_packed_linears,
            )
            results[family] = {str(r["batch"]): r for r in rows}
    finally:
        torch.set_num_threads(threads)  # main() may run inside another program (a test)
    print(f"{'family':<8} {'batch':>5} {'ours tok/s':>11} {'HF tok/s':>9} {'ratio':>6}")
    for family, by_batch in results.items():
        for b, r in by_batch.items():
            print(
                f"{family:<8} {b:>5} {r['ours_decode_tps']:>11.1f} "
                f"{r['hf_decode_tps']:>9.1f} {r['ratio_decode']:>6.2f}"
            )
    top = str(max(batches))
    report = {
        "shape": args.shape,
        "batches": batches,
        "threads": args.threads or threads,
        "cpu_packed_linears": args.cpu_packed_linears,
        "families": results,
        "goal": {"batch": int(top), "ratio": GOAL},
        "goal_met": {f: rows[top]["ratio_decode"] >= GOAL for f, rows in results.items()},
    }
    if args.plot is not None:
        plot(report, args.plot)
    print(json.dumps(report, sort_keys=True))
    return report


if __name__ == "__main__":
    main()
