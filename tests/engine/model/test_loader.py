"""load_model: dispatch by path, revision digests, errors, tokenizer from the folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engine.errors import InvalidRequestError, UnsupportedModelError
from engine.model.loader import default_model_path, load_model, model_revision
from engine.model.tokenizer import ChatTemplateMissingError, load_hf_tokenizer


def test_loads_folder_with_its_tokenizer(tiny_llama_dir: Path) -> None:
    loaded = load_model(str(tiny_llama_dir), dtype=torch.float32, device="cpu", progress=True)
    assert loaded.name == tiny_llama_dir.name
    assert loaded.arch.num_layers == 2 and loaded.arch.vocab_size == 49152
    assert loaded.tokenizer.vocab_size == 49152
    assert 2 in loaded.tokenizer.eos_token_ids
    assert loaded.revision == model_revision(tiny_llama_dir)
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())


def test_revision_is_stable_and_follows_the_weights(tiny_llama_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tiny_llama_dir, copy)
    assert model_revision(copy) == model_revision(tiny_llama_dir)
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert model_revision(copy) != model_revision(tiny_llama_dir)


def test_missing_and_unrecognised_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="does not exist"):
        load_model(str(tmp_path / "nope"), dtype=torch.float32, device="cpu")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(UnsupportedModelError, match="neither"):
        load_model(str(tmp_path / "weights.bin"), dtype=torch.float32, device="cpu")
    with pytest.raises(UnsupportedModelError, match="neither"):
        load_model(str(tmp_path), dtype=torch.float32, device="cpu")


def test_default_model_path_points_at_the_bundled_gguf() -> None:
    path = Path(default_model_path())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()


def test_folder_tokenizer_round_trip_and_chat(tiny_llama_dir: Path) -> None:
    tok = load_hf_tokenizer(tiny_llama_dir)
    ids = tok.encode("Tiny models, real tokens.", add_special_tokens=False)
    assert tok.decode(ids) == "Tiny models, real tokens."
    rendered = tok.apply_chat_template([{"role": "user", "content": "yo"}])
    assert "<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n" in rendered


@pytest.mark.parametrize("special", [True, False])
def test_encode_agrees_with_transformers(tiny_llama_dir: Path, special: bool) -> None:
    # encode() calls the Rust tokenizer directly; it must give what transformers gives,
    # added tokens, odd whitespace and non-ASCII text included.
    tok = load_hf_tokenizer(tiny_llama_dir)
    texts = [
        "",
        " leading space",
        "tabs\tand\n\nnewlines  ",
        "é ü 中文 🙂",
        "<|im_start|>user\nHi<|im_end|>\n<|endoftext|>tail",
        tok.apply_chat_template([{"role": "user", "content": "Write one sentence."}]),
    ]
    for text in texts:
        assert tok.encode(text, add_special_tokens=special) == tok.hf.encode(
            text, add_special_tokens=special
        )


def test_missing_chat_template_is_a_clear_request_error(tiny_llama_dir: Path) -> None:
    tok = load_hf_tokenizer(tiny_llama_dir)
    tok.hf.chat_template = None
    with pytest.raises(ChatTemplateMissingError, match="no chat template") as info:
        tok.apply_chat_template([{"role": "user", "content": "yo"}])
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.param == "messages"
