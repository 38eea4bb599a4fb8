"""Shared fixtures: one tiny random-weight model folder per test session."""

from __future__ import annotations

import pathlib

import pytest

from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A 2-layer Llama with the real SmolLM2 tokenizer and seeded random weights."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))


PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "One two three four five six seven eight nine ten eleven twelve thirteen fourteen",
    "Hi",
    "A much longer prompt that goes on for a while so that it spans several KV blocks "
    "and needs more than one prefill chunk when the chunk size is small enough, which "
    "is exactly what the invariance tests want to exercise here.",
    "Emoji 🎉 and 中文 text",
]
