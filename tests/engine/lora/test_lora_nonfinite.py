"""An adapter with a NaN or infinite weight is refused at load (issue 46, item 1).

Such an adapter can only make NaN, so the engine refuses it (InvalidAdapterError naming
the tensor) rather than serve it; see tests/engine/model/test_nonfinite_isolation.py for
why a NaN row that does get through still spoils only its own rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import InvalidAdapterError
from engine.lora.peft import read_peft_adapter
from engine.model.hf_loader import architecture_from_config
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.lora_engine import Adapters, make_engine

KEY = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"


def _poisoned(adapters: Adapters, folder: Path, key: str, value: float, dtype: torch.dtype) -> Path:
    """A copy of a valid rank-4 adapter in `dtype` with one value of `key` set to `value`."""
    make_peft_adapter(folder, adapters.model, 4, 8, seed=9)
    weights = folder / "adapter_model.safetensors"
    tensors = {k: t.to(dtype) for k, t in load_file(str(weights)).items()}
    tensors[key][2, 1] = value
    save_file(tensors, str(weights))
    return folder


@pytest.mark.parametrize(
    ("key", "value", "dtype"),
    [
        (KEY, float("nan"), torch.float32),
        (KEY.replace("lora_B", "lora_A"), float("inf"), torch.float16),
        (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            -float("inf"),
            torch.bfloat16,
        ),
    ],
    ids=["nan-B-f32", "inf-A-f16", "minus-inf-A-bf16"],
)
def test_non_finite_weights_are_refused_naming_the_tensor(
    adapters: Adapters, tmp_path: Path, key: str, value: float, dtype: torch.dtype
) -> None:
    folder = _poisoned(adapters, tmp_path / "bad", key, value, dtype)
    arch = architecture_from_config(json.loads((adapters.model / "config.json").read_text()))
    with pytest.raises(InvalidAdapterError, match="non-finite") as info:
        read_peft_adapter("bad", folder, arch, 16)
    assert key in str(info.value)
    # A finite copy in the same dtype loads.
    good = _poisoned(adapters, tmp_path / "good", key, 0.5, dtype)
    assert read_peft_adapter("good", good, arch, 16).info.rank == 4


def test_a_scaling_that_overflows_is_refused(adapters: Adapters, tmp_path: Path) -> None:
    # Finite weights, but alpha / r times B leaves float32's range.
    folder = _poisoned(adapters, tmp_path / "huge", KEY, 3e38, torch.float32)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 64}))
    arch = architecture_from_config(json.loads((adapters.model / "config.json").read_text()))
    with pytest.raises(InvalidAdapterError, match="layer 1 down_proj.*overflows"):
        read_peft_adapter("huge", folder, arch, 16)


def test_the_engine_refuses_to_load_a_nan_adapter(adapters: Adapters, tmp_path: Path) -> None:
    engine = make_engine(adapters.model)
    folder = _poisoned(adapters, tmp_path / "nan", KEY, float("nan"), torch.float32)
    with pytest.raises(InvalidAdapterError, match="non-finite") as info:
        engine.load_adapter("nan", str(folder))
    assert KEY in str(info.value) and info.value.code == "invalid_adapter"
    assert engine.adapters() == []
    engine.load_adapter("r4", str(adapters.paths["r4"]))  # the engine goes on loading others
    assert [a.name for a in engine.adapters()] == ["r4"]
