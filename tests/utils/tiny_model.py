"""Tiny random-weight Hugging Face model folders with SmolLM2's real tokenizer.

The vocabulary stays SmolLM2's 49152 tokens so that chat templates, stop tokens
and detokenization are real; everything else is small enough for CPU tests.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.config import ModelArchitecture
from engine.model.hf_loader import architecture_from_config
from engine.model.llama import LlamaForCausalLM

SMOLLM2_VOCAB = 49152


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's GGUF tokenizer converted once per test session and saved to a temp folder."""
    from transformers import AutoTokenizer

    from engine.model.loader import default_model_path

    gguf = Path(default_model_path())
    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    folder = Path(tempfile.mkdtemp(prefix="cloister-smollm2-tokenizer-"))
    hf.save_pretrained(str(folder))
    return folder


def tiny_config(
    *,
    num_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    tie: bool = True,
    qwen2: bool = False,
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
    max_positions: int = 2048,
) -> dict[str, Any]:
    """A transformers-style config.json dict for a tiny Llama or Qwen2."""
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "vocab_size": SMOLLM2_VOCAB,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    if not qwen2:
        config["attention_bias"] = False
    return config


def random_state_dict(arch: ModelArchitecture, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights in HF naming; norms and biases are perturbed so they matter."""
    generator = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="cpu")
    return {
        name: random_weight(name, param.shape, generator).contiguous()
        for name, param in model.named_parameters()
    }


def random_weight(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """One seeded weight, by its HF name: norms near 1 and biases of 0.1 (so they matter),
    matrices of std 1/sqrt(fan_in), embeddings of std 1."""
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=generator)
    if name.endswith(".bias"):
        return 0.1 * torch.randn(shape, generator=generator)
    fan_in = shape[-1] if "embed_tokens" not in name else 1
    return torch.randn(shape, generator=generator) / fan_in**0.5


def make_tiny_model_dir(
    tmp_path: Path,
    *,
    num_layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seed: int = 0,
    tie: bool = True,
    qwen2: bool = False,
    vocab_from: str = "smollm2",
    rope_theta: float = 10000.0,
    rope_scaling: dict[str, Any] | None = None,
) -> Path:
    """Writes config.json, model.safetensors and tokenizer files; returns the folder."""
    if vocab_from != "smollm2":
        raise ValueError(f"unknown vocab source {vocab_from!r}; only 'smollm2' exists")
    folder = Path(tmp_path) / f"tiny-{'qwen2' if qwen2 else 'llama'}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(
        num_layers=num_layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        intermediate=intermediate,
        tie=tie,
        qwen2=qwen2,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
    )
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = random_state_dict(architecture_from_config(config), seed)
    if tie:
        state.pop("lm_head.weight", None)  # safetensors refuses shared storage
    save_file(state, str(folder / "model.safetensors"))
    for item in smollm2_tokenizer_dir().iterdir():
        shutil.copy(item, folder / item.name)
    return folder
