"""Packing q/k/v and gate/up into one GEMM each changes no output and no checkpoint name."""

from __future__ import annotations

import pytest
import torch

from engine.model.hf_loader import architecture_from_config
from engine.model.llama import LlamaForCausalLM
from tests.utils.model_step import ModelStepper
from tests.utils.tiny_model import random_state_dict, tiny_config


@pytest.mark.parametrize("qwen2", [False, True])
def test_fused_model_matches_unfused(qwen2: bool) -> None:
    arch = architecture_from_config(tiny_config(qwen2=qwen2))
    state = random_state_dict(arch, seed=3)
    fused = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="cpu")
    fused.load_weights(state.items())  # loading packs the projections
    plain = LlamaForCausalLM(arch).eval()
    plain.load_state_dict(state, strict=False)
    assert fused.model.layers[0].self_attn.qkv_weight is not None
    assert plain.model.layers[0].self_attn.qkv_weight is None
    # The HF-named parameters still hold the loaded values, and no packed copy is saved.
    assert set(fused.state_dict()) == set(plain.state_dict())
    for name, value in fused.state_dict().items():
        torch.testing.assert_close(value, plain.state_dict()[name], rtol=0, atol=0)
    prompts = [[5, 9, 200, 31, 7], [1, 2]]
    with torch.inference_mode():
        a = ModelStepper(fused, num_seqs=2).step(prompts)
        b = ModelStepper(plain, num_seqs=2).step(prompts)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
