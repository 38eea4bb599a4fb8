"""FP8 Hugging Face checkpoints (fine-grained blocks, compressed-tensors per channel or
per tensor) load dequantized, and compute what their dequantized weights compute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import UnsupportedModelError
from engine.model.loader import load_model
from engine.planning.model_source import read_model_facts
from tests.utils.decoded_reference import logits_against_decoded
from tests.utils.hf_families import make_family_dir

FP8_MAX = 448.0  # the largest float8_e4m3fn value


def _quantize(w: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8 weight, its scale) in one of the layouts releases use."""
    if layout == "tensor":
        scale = w.abs().max() / FP8_MAX
        return (w / scale).to(torch.float8_e4m3fn), scale.reshape(1)
    if layout == "channel":
        scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
        return (w / scale).to(torch.float8_e4m3fn), scale
    rows, cols = 16, 32  # blocks; the last ones are partial for these shapes
    grid = w.new_zeros((-(-w.shape[0] // rows), -(-w.shape[1] // cols)))
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            tile = w[i * rows : (i + 1) * rows, j * cols : (j + 1) * cols]
            grid[i, j] = tile.abs().max() / FP8_MAX
    full = grid.repeat_interleave(rows, 0).repeat_interleave(cols, 1)[: w.shape[0], : w.shape[1]]
    return (w / full).to(torch.float8_e4m3fn), grid


def _quantization_config(layout: str) -> dict[str, Any]:
    if layout == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 32]}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": layout},
            }
        },
        "ignore": ["lm_head"],
    }


def make_fp8_folder(tmp: Path, family: str, layout: str) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny model of `family` with its projections in FP8; returns the folder and the
    weights its FP8 tensors decode to (the reference)."""
    folder = make_family_dir(tmp, family, seed=6, intermediate_size=96)
    state = load_file(str(folder / "model.safetensors"))
    decoded = dict(state)
    for name, w in list(state.items()):
        if w.dim() == 2 and "proj" in name:
            q, scale = _quantize(w, layout)
            state[name] = q
            state[name + ("_scale_inv" if layout == "block" else "_scale")] = scale
            if layout != "block":
                state[name.replace(".weight", ".input_scale")] = torch.ones(1)
            dequant = q.float() * (scale if layout != "block" else _full(scale, w.shape))
            decoded[name] = dequant
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = _quantization_config(layout)
    (folder / "config.json").write_text(json.dumps(config))
    return folder, decoded


def _full(grid: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return grid.repeat_interleave(16, 0).repeat_interleave(32, 1)[: shape[0], : shape[1]]


@pytest.mark.parametrize("layout", ["block", "channel", "tensor"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_an_fp8_checkpoint_computes_what_its_decoded_weights_do(
    tmp_path: Path, family: str, layout: str
) -> None:
    folder, decoded = make_fp8_folder(tmp_path, family, layout)
    ours, reference = logits_against_decoded(folder, lambda _: decoded.items(), [*range(200, 214)])
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert read_model_facts(folder).quantization.startswith("FP8 (")


def test_fp8_decoding_is_close_to_the_original_weights(tmp_path: Path) -> None:
    folder, decoded = make_fp8_folder(tmp_path, "llama", "channel")
    original = load_file(
        str(
            make_family_dir(tmp_path / "o", "llama", seed=6, intermediate_size=96)
            / "model.safetensors"
        )
    )
    w, d = (
        original["model.layers.0.mlp.up_proj.weight"],
        decoded["model.layers.0.mlp.up_proj.weight"],
    )
    assert 0 < (w - d).abs().max() <= 0.07 * w.abs().max()  # e4m3 keeps 3 mantissa bits


@pytest.mark.parametrize(
    ("quantization", "words"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
        ({"quant_method": "hqq", "nbits": 4}, "'hqq'"),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
          "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"}}}},
         "'nvfp4-pack-quantized'"),
        ("gptq", "must be an object"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size"),
    ],
)  # fmt: skip
def test_other_quantizations_are_refused_by_name(
    tmp_path: Path, quantization: Any, words: str
) -> None:
    folder = make_family_dir(tmp_path, "llama")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match=words):
        load_model(str(folder), dtype=torch.float32, device="cpu")


def test_a_missing_scale_is_refused_by_name(tmp_path: Path) -> None:
    folder, _ = make_fp8_folder(tmp_path, "llama", "channel")
    state = load_file(str(folder / "model.safetensors"))
    state.pop("model.layers.1.self_attn.k_proj.weight_scale")
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match="k_proj.weight' has no weight_scale"):
        load_model(str(folder), dtype=torch.float32, device="cpu")
