"""Fixtures for the model package's tests: tiny HF folders and the real SmolLM2 file."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.loader import default_model_path
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The bundled SmolLM2 GGUF file."""
    return Path(default_model_path())


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tied tiny Llama folder shared by the session (read-only use)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny"), seed=0)
