"""The real SmolLM2-135M GGUF: metadata, parity with transformers, its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from engine.model.gguf_loader import read_architecture
from engine.model.loader import LoadedModel, load_model, model_revision
from tests.utils.hf_smollm2 import hf_smollm2
from tests.utils.model_step import ModelStepper

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> LoadedModel:
    return load_model(None, dtype=torch.float32, device="cpu")


def test_metadata_maps_to_architecture(smollm2_path: Path) -> None:
    arch = read_architecture(GGUFReader(str(smollm2_path)))
    assert arch.architecture == "llama"
    assert (arch.num_layers, arch.num_heads, arch.num_kv_heads, arch.head_dim) == (30, 9, 3, 64)
    assert (arch.hidden_size, arch.intermediate_size, arch.vocab_size) == (576, 1536, 49152)
    assert arch.rope_theta == 100000.0
    assert arch.rms_norm_eps == 1e-5
    assert arch.max_position_embeddings == 8192
    assert arch.tie_word_embeddings
    assert arch.rope_scaling is None
    assert not arch.attention_bias


def test_load_model_defaults_to_smollm2(smollm2: LoadedModel, smollm2_path: Path) -> None:
    assert smollm2.name == "SmolLM2-135M-Instruct.Q4_1"
    assert smollm2.revision == model_revision(smollm2_path)
    assert len(smollm2.revision) == 16
    assert smollm2.model.lm_head.weight is smollm2.model.model.embed_tokens.weight


def test_first_step_logits_match_transformers(smollm2: LoadedModel) -> None:
    hf = hf_smollm2()
    for prompt in PROMPTS:
        ids = smollm2.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        ours = ModelStepper(smollm2.model, max_len=64).step([ids])
        assert (ours - ref).abs().max().item() < 1e-3, prompt
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_greedy_decode_with_cache_matches_full_recompute(smollm2: LoadedModel) -> None:
    ids = smollm2.tokenizer.encode(PROMPTS[0])
    stepper = ModelStepper(smollm2.model, max_len=64)
    logits = stepper.step([ids])[-1:]
    generated = []
    for _ in range(4):
        token = int(logits.argmax(-1))
        generated.append(token)
        logits = stepper.step([[token]])
    full = ModelStepper(smollm2.model, max_len=64).step([ids + generated])
    assert full[len(ids) - 1 :].argmax(-1).tolist()[:4] == generated
    assert "Paris" in smollm2.tokenizer.decode(generated)


def test_tokenizer_round_trip_and_chat_template(smollm2: LoadedModel) -> None:
    tok = smollm2.tokenizer
    text = "Hello, world! Ünïcödé and 123 numbers."
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.vocab_size == 49152
    assert 2 in tok.eos_token_ids
    assert tok.convert_ids_to_tokens([2]) == ["<|im_end|>"]
    assert tok.bos_token_id == 1
    assert {0, 1, 2} <= tok.all_special_ids
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi there"}])
    assert rendered.endswith("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
    assert rendered.startswith("<|im_start|>system\n")
    no_prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=False
    )
    assert not no_prompt.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode(rendered), skip_special_tokens=False) == rendered
