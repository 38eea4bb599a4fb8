"""The tiny random model and a fresh engine over it, for the structured-decoding tests."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from engine.llm_engine import LLMEngine
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny random model (one a test module)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("structured"))


@pytest.fixture
def engine(folder: pathlib.Path) -> Iterator[LLMEngine]:
    """A fresh engine that keeps finished requests (its runner's matchers start empty)."""
    eng = LLMEngine.from_options(str(folder), num_blocks=128, attention_backend="torch")
    eng.keep_finished = True
    yield eng
    eng.grammars.shutdown()
