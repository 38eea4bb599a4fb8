"""Hugging Face folders: config mapping (v4 and v5 spellings), shards, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import UnsupportedModelError
from engine.model.hf_loader import architecture_from_config, load_hf_model
from engine.model.registry import SUPPORTED
from tests.utils.model_step import ModelStepper
from tests.utils.tiny_model import tiny_config


def test_transformers_v5_rope_parameters_are_read() -> None:
    config = tiny_config()
    del config["rope_theta"], config["rope_scaling"]
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    arch = architecture_from_config(config)
    assert arch.rope_theta == 5e5
    assert dict(arch.rope_scaling or ()) == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_type_means_no_scaling() -> None:
    config = tiny_config(rope_scaling={"rope_type": "default"})
    assert architecture_from_config(config).rope_scaling is None


def test_qwen2_has_qkv_bias_and_head_dim_is_explicit_when_given() -> None:
    arch = architecture_from_config(tiny_config(qwen2=True))
    assert arch.attention_bias and arch.architecture == "qwen2"
    config = tiny_config()
    config["head_dim"] = 32
    assert architecture_from_config(config).head_dim == 32


def test_unsupported_architecture_is_named() -> None:
    config = tiny_config()
    config["architectures"] = ["FalconForCausalLM"]
    with pytest.raises(UnsupportedModelError, match="FalconForCausalLM") as refused:
        architecture_from_config(config)
    # The refusal names what is supported, from the registry.
    assert all(name in str(refused.value) for name in SUPPORTED)


def test_sharded_folder_loads_like_single_file(tiny_llama_dir: Path, tmp_path: Path) -> None:
    state = load_file(str(tiny_llama_dir / "model.safetensors"))
    names = sorted(state)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half]}
    shards["model-00002-of-00002.safetensors"] = names[half:]
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / file))
        weight_map.update(dict.fromkeys(keys, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())

    sharded, _ = load_hf_model(tmp_path, dtype=torch.float32, device="cpu")
    single, _ = load_hf_model(tiny_llama_dir, dtype=torch.float32, device="cpu")
    ids = [7, 8, 9]
    torch.testing.assert_close(ModelStepper(sharded).step([ids]), ModelStepper(single).step([ids]))


def test_missing_weight_is_refused(tiny_llama_dir: Path, tmp_path: Path) -> None:
    state = load_file(str(tiny_llama_dir / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_model(tmp_path, dtype=torch.float32, device="cpu")


def test_wrong_shape_is_refused(tiny_llama_dir: Path, tmp_path: Path) -> None:
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["intermediate_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(
        (tiny_llama_dir / "model.safetensors").read_bytes()
    )
    with pytest.raises(UnsupportedModelError, match="shape"):
        load_hf_model(tmp_path, dtype=torch.float32, device="cpu")
