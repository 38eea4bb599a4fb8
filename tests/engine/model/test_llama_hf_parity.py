"""Our Llama/Qwen2 on tiny random folders matches transformers' reference models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.model.loader import load_model
from tests.utils.model_step import ModelStepper
from tests.utils.tiny_model import make_tiny_model_dir

PROMPT = "Hello there, how are you doing today? Fine."
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    ("kwargs", "hf_class"),
    [
        ({"tie": True}, "LlamaForCausalLM"),
        ({"tie": False}, "LlamaForCausalLM"),
        ({"qwen2": True, "tie": False}, "Qwen2ForCausalLM"),
        ({"qwen2": True, "tie": True, "kv_heads": 1}, "Qwen2ForCausalLM"),
        ({"rope_scaling": LLAMA3, "rope_theta": 500000.0}, "LlamaForCausalLM"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "LlamaForCausalLM"),
    ],
)
def test_prefill_then_decode_matches_transformers(
    tmp_path: Path, kwargs: dict[str, Any], hf_class: str
) -> None:
    folder = make_tiny_model_dir(tmp_path, seed=3, **kwargs)
    loaded = load_model(str(folder), dtype=torch.float32, device="cpu")
    ids = loaded.tokenizer.encode(PROMPT)[:6]
    assert len(ids) == 6
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    assert type(hf).__name__ == hf_class
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()

    stepper = ModelStepper(loaded.model, block_size=4)
    prefill = stepper.step([ids[:5]])
    decode = stepper.step([ids[5:6]])
    ours = torch.cat([prefill, decode])
    assert ours.dtype == torch.float32
    assert ours.shape == (6, 49152)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)


def test_rope_scaling_changes_the_output(tmp_path: Path) -> None:
    plain = make_tiny_model_dir(tmp_path / "a", seed=1)
    scaled = make_tiny_model_dir(tmp_path / "b", seed=1, rope_scaling=LLAMA3)
    ids = list(range(100, 120))
    a = ModelStepper(load_model(str(plain), dtype=torch.float32, device="cpu").model).step([ids])
    b = ModelStepper(load_model(str(scaled), dtype=torch.float32, device="cpu").model).step([ids])
    assert (a - b).abs().max() > 1e-3


def test_flat_batch_of_two_sequences_equals_separate_runs(tiny_llama_dir: Path) -> None:
    model = load_model(str(tiny_llama_dir), dtype=torch.float32, device="cpu").model
    s1, s2 = [5, 6, 7, 8, 9, 10, 11], [300, 301, 302]
    together = ModelStepper(model, num_seqs=2)
    first = together.step([s1[:4], s2])  # a prefill chunk next to a full prefill
    second = together.step([s1[4:], [303]])  # a chunk continuing next to a decode
    alone1 = ModelStepper(model).step([s1])
    alone2 = ModelStepper(model).step([s2 + [303]])
    torch.testing.assert_close(torch.cat([first[:4], second[:3]]), alone1, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cat([first[4:], second[3:]]), alone2, atol=1e-4, rtol=0)


def test_bfloat16_model_tracks_float32(tiny_llama_dir: Path) -> None:
    ids = list(range(1000, 1012))
    ref = ModelStepper(load_model(str(tiny_llama_dir), dtype=torch.float32, device="cpu").model)
    low = load_model(str(tiny_llama_dir), dtype=torch.bfloat16, device="cpu").model
    assert next(low.parameters()).dtype == torch.bfloat16
    out = ModelStepper(low).step([ids])
    assert out.dtype == torch.float32
    expected = ref.step([ids])
    assert (out.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.75
