"""Tokenizer.decode: the direct Rust path gives transformers' text, or is not taken."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.model.tokenizer import Tokenizer, load_gguf_tokenizer, load_hf_tokenizer

_TEXTS = [
    "Hello , world ! Don 't stop ; it 's fine ? Yes .",
    " leading space and  double  spaces, then\ttabs\n\nand newlines ",
    "é ü 中文 🙂 👩‍👩‍👧 ∑ x² — “quotes”",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello !<|im_end|><|endoftext|>",
    "def f(x):\n    return x  # comment\n",
]


def _sequences(tok: Tokenizer) -> list[list[int]]:
    """Many id sequences: every window of real text, special ids, random ids."""
    rng = random.Random(1234)
    seqs: list[list[int]] = []
    for text in _TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        # Every window of up to 7 tokens: windows that cut a multi-byte character
        # (emoji, CJK) in half decode to U+FFFD, as the detokenizer sees them.
        seqs.extend(ids[i:j] for i in range(len(ids)) for j in range(i + 1, min(i + 8, len(ids))))
        seqs.append(ids)
        seqs.append([1, *ids, 2])
    specials = sorted(tok.all_special_ids)
    seqs.append([])
    seqs.extend([s] for s in range(20))
    for _ in range(1500):
        length = rng.randint(1, 12)
        seqs.append([rng.randrange(tok.vocab_size) for _ in range(length)])
        mixed = [rng.randrange(tok.vocab_size) for _ in range(length)]
        mixed.insert(rng.randrange(length + 1), rng.choice(specials))
        seqs.append(mixed)
    return seqs


@pytest.fixture(scope="module")
def folder_tokenizer(tiny_llama_dir: Path) -> Tokenizer:
    """SmolLM2's tokenizer as saved in a Hugging Face folder."""
    return load_hf_tokenizer(tiny_llama_dir)


@pytest.fixture(scope="module")
def gguf_tokenizer(smollm2_path: Path) -> Tokenizer:
    """SmolLM2's tokenizer as converted from its GGUF file (what `serve` uses by default)."""
    return load_gguf_tokenizer(smollm2_path)


@pytest.mark.parametrize("source", ["folder_tokenizer", "gguf_tokenizer"])
@pytest.mark.parametrize("skip", [True, False])
def test_decode_agrees_with_transformers(
    source: str, skip: bool, request: pytest.FixtureRequest
) -> None:
    tok: Tokenizer = request.getfixturevalue(source)
    assert tok._fast_decode is not None  # SmolLM2 takes the direct path
    seqs = _sequences(tok)
    assert any("\ufffd" in tok.decode(s) for s in seqs)  # partial characters are covered
    for ids in seqs:
        assert tok.decode(ids, skip_special_tokens=skip) == tok.hf.decode(
            ids, skip_special_tokens=skip
        ), ids
        assert tok.decode(tuple(ids), skip_special_tokens=skip) == tok.decode(ids, skip)


def test_cleanup_of_spaces_keeps_transformers_decode(tiny_llama_dir: Path) -> None:
    # transformers may strip spaces before punctuation for such tokenizers; Rust alone never.
    hf = load_hf_tokenizer(tiny_llama_dir).hf
    hf.clean_up_tokenization_spaces = True
    tok = Tokenizer(hf)
    assert tok._fast_decode is None
    ids = tok.encode("Hello , world ! It 's", add_special_tokens=False)
    assert tok.decode(ids) == hf.decode(ids)


def test_overridden_decode_keeps_transformers_decode(tiny_llama_dir: Path) -> None:
    hf = load_hf_tokenizer(tiny_llama_dir).hf

    class PostProcessing(type(hf)):  # type: ignore[misc]
        def _decode(self, token_ids: Any, **kwargs: Any) -> str:
            return str(super()._decode(token_ids, **kwargs)).upper()

    hf.__class__ = PostProcessing
    tok = Tokenizer(hf)
    assert tok._fast_decode is None
    ids = tok.encode("quiet text", add_special_tokens=False)
    assert tok.decode(ids) == "QUIET TEXT"
