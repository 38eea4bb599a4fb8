"""A tiny model and synthetic PEFT adapters of ranks 4, 8 and 16 (the engine driver:
tests/utils/lora_engine.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.lora_engine import Adapters
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="package")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> Adapters:
    root = tmp_path_factory.mktemp("lora")
    model = make_tiny_model_dir(root, seed=7)
    paths = {
        "r4": make_peft_adapter(root / "r4", model, 4, 8, seed=1),
        "r8": make_peft_adapter(root / "r8", model, 8, 16, ("q_proj", "v_proj"), seed=2),
        "r16": make_peft_adapter(
            root / "r16", model, 16, 4, ("gate_proj", "up_proj", "down_proj"), 3, use_rslora=True
        ),
        "r8b": make_peft_adapter(root / "r8b", model, 8, 8, seed=4),
        "r4b": make_peft_adapter(root / "r4b", model, 4, 4, ("k_proj", "o_proj"), seed=5),
    }
    return Adapters(model, paths)


@pytest.fixture
def logits_log() -> Iterator[list[torch.Tensor]]:
    yield []
