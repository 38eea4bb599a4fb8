"""Fixtures of the disk-tier tests (test_disk_tier.py and the tests beside it that use
disk_tier_setup.py): one tiny model folder and its KV block size per module."""

from __future__ import annotations

import pathlib

import pytest

from engine.llm_engine import LLMEngine
from tests.engine.prefix_cache.disk_tier_setup import BLOCK
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny random-weight model folder."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny_disk_tier"))


@pytest.fixture(scope="module")
def block_bytes(tiny_model: pathlib.Path) -> int:
    """The bytes of one KV block of `tiny_model` (BLOCK tokens)."""
    engine = LLMEngine.from_options(str(tiny_model), num_blocks=12, block_size=BLOCK)
    return engine.capacity.bytes_per_block
