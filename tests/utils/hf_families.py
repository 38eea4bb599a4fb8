"""Tiny random-weight Hugging Face folders of each family, built by transformers itself.

transformers builds the model offline from a config of the family's real shape
(nothing is downloaded) and saves it, so the folder holds the family's own weight
names and layout (Phi-3's fused projections, Qwen3's q/k norms); SmolLM2's tokenizer
is copied in so chat templates and detokenization are real.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    MixtralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from engine.model.registry import family_named
from tests.utils.tiny_model import SMOLLM2_VOCAB, random_weight, smollm2_tokenizer_dir

_CONFIGS: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "mistral": MistralConfig,
    "phi3": Phi3Config,
    "mixtral": MixtralConfig,
    "qwen3_moe": Qwen3MoeConfig,
    "gemma2": Gemma2Config,
    "gemma3": Gemma3TextConfig,
}
# Each family's own fields at the tiny shape (experts: 4, top 2; Qwen3-MoE with its
# released norm_topk_prob and one dense layer, as mlp_only_layers allows).
_EXTRAS: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "norm_topk_prob": True,
        "num_hidden_layers": 3,
        "mlp_only_layers": [1],
    },
    # gemma-2-2b's shape, shrunk: window and global layers in turn (a window of 8), the
    # released caps (50 on the attention scores, 30 on the logits), query_pre_attn_scalar
    # equal to head_dim, tied embeddings.
    "gemma2": {
        "num_hidden_layers": 4,
        "sliding_window": 8,
        "query_pre_attn_scalar": 16,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
    },
    # Six layers: five with a window of 8, one global, as Gemma 3's pattern has them.
    "gemma3": {"num_hidden_layers": 6, "sliding_window": 8, "tie_word_embeddings": True},
}
TINY_SHAPE: dict[str, Any] = {
    "vocab_size": SMOLLM2_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}


def family_config(family: str, **overrides: Any) -> PretrainedConfig:
    """The family's transformers config at the tiny shape, with `overrides` on top."""
    declared = {"architectures": list(family_named(family).hf_architectures[:1])}
    extras = _EXTRAS.get(family, {})
    return _CONFIGS[family](**{**TINY_SHAPE, **declared, **extras, **overrides})


def randomize(model: PreTrainedModel, seed: int) -> None:
    """Seeded weights large enough that every part matters (HF's init makes norms 1
    and weights ~0.02, under which q/k norms or biases barely change the logits)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(random_weight(name, param.shape, generator))


def make_family_dir(tmp_path: Path, family: str, *, seed: int = 0, **overrides: Any) -> Path:
    """Writes a tiny `family` model (config, safetensors, tokenizer); returns the folder."""
    config = family_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model, seed)
    folder = Path(tmp_path) / f"tiny-{family}-seed{seed}"
    model.save_pretrained(str(folder))
    for item in smollm2_tokenizer_dir().iterdir():
        shutil.copy(item, folder / item.name)
    return folder


def load_reference(folder: Path) -> PreTrainedModel:
    """transformers' own model from the folder, fp32, eval mode, eager attention."""
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def hf_logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """transformers' fp32 logits for every position of `ids`, [len(ids), vocab]."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hf_greedy(model: PreTrainedModel, ids: list[int], steps: int = 32) -> list[int]:
    """Arg-max decoding with transformers, EOS not special; the whole sequence is run
    again each step (tiny models), so no cache of theirs is involved."""
    tokens: list[int] = []
    for _ in range(steps):
        tokens.append(int(hf_logits(model, ids + tokens)[-1].argmax()))
    return tokens
