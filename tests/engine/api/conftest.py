"""Shared fixtures: one tiny random-weight model folder per test session."""

from __future__ import annotations

import pathlib

import pytest

from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A 2-layer Llama with the real SmolLM2 tokenizer and seeded random weights."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"))
