"""Writes a Hugging Face model folder with seeded random weights in a real model's shape.

`cloister serve --model <folder>` then serves it like any checkpoint: what the GPU
check uses to measure the service on a machine with no model files and no network.
The tokenizer files are copied from a folder given on the command line (SmolLM2's,
made by scripts/gpu_prepare.sh), so every shape keeps SmolLM2's 49152-token
vocabulary: prompts tokenize and any generated id decodes.

    python bench/serve_model.py --shape smollm2-135m --tokenizer var/gpu/tokenizer \
        --out /tmp/serve-model [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

# Run as a script (python bench/NAME.py), this folder is on the path, not the project's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.model_shape import ModelShape  # noqa: E402

VOCAB = 49152  # SmolLM2's tokenizer

SHAPES = {
    "smollm2-135m": ModelShape("smollm2-135m", 30, 576, 9, 3, 64, 1536, VOCAB, rope_theta=1e5),
    # Llama-3.2-1B's layers with SmolLM2's vocabulary (its own is 128256).
    "llama-1b": ModelShape("llama-1b", 16, 2048, 32, 8, 64, 8192, VOCAB, rope_theta=5e5),
    "tiny": ModelShape("tiny", 2, 64, 4, 2, 16, 128, VOCAB),  # the CPU dry run
}


def hf_config(shape: ModelShape, max_positions: int) -> dict[str, object]:
    """A transformers LlamaForCausalLM config.json for `shape`."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": shape.rope_theta,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": shape.tie,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    }


@torch.no_grad()
def random_weights(
    shape: ModelShape, *, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """HF-named seeded weights: matrices std 1/sqrt(fan_in), the embedding hidden^-1/4
    (logits a few nats wide, like a trained model's), norms 1 + 0.1 noise."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, q, kv = (
        shape.hidden_size,
        shape.num_heads * shape.head_dim,
        shape.num_kv_heads * shape.head_dim,
    )
    inter = shape.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (shape.vocab_size, h),
        "model.norm.weight": (h,),
    }
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    if not shape.tie:
        shapes["lm_head.weight"] = (shape.vocab_size, h)
    out: dict[str, torch.Tensor] = {}
    for name, dims in shapes.items():
        noise = torch.randn(dims, generator=gen, device=device)
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * noise
        else:
            value = noise * (h**-0.25 if "embed_tokens" in name else dims[-1] ** -0.5)
        out[name] = value.to(dtype).cpu().contiguous()
    return out


def write_model_dir(
    out: Path,
    shape_name: str,
    tokenizer_dir: Path,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | None = None,
    seed: int = 0,
    max_positions: int = 8192,
) -> Path:
    """config.json, model.safetensors and the tokenizer files in `out`; returns `out`."""
    from safetensors.torch import save_file

    shape = SHAPES[shape_name]
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(shape, max_positions), indent=2))
    save_file(
        random_weights(shape, dtype=dtype, device=device, seed=seed), str(out / "model.safetensors")
    )
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy(item, out / item.name)
    return out


def main() -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m")
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder of tokenizer files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument(
        "--device", default=None, help="where to draw the weights (default: cuda if any)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-positions", type=int, default=8192)
    args = parser.parse_args()
    folder = write_model_dir(
        args.out,
        args.shape,
        args.tokenizer,
        dtype=getattr(torch, args.dtype),
        device=torch.device(args.device) if args.device else None,
        seed=args.seed,
        max_positions=args.max_positions,
    )
    print(json.dumps({"model_dir": str(folder), "shape": args.shape, "dtype": args.dtype}))


if __name__ == "__main__":
    main()
