"""GGUF files of the families whose llama.cpp layout differs from Llama's (Phi-3's fused
tensors, Gemma 2's and 3's norms, layer patterns and soft caps) compute what their HF
folders compute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gguf import GGUFReader

from engine.model.gguf_loader import load_gguf_model, read_architecture
from engine.model.hf_loader import architecture_from_config, read_config
from engine.model.loader import load_model
from tests.engine.model.gguf_files import write_family_gguf
from tests.utils.hf_families import make_family_dir
from tests.utils.model_step import ModelStepper

# Gemma's released sizes have query_pre_attn_scalar == head_dim (the 27B aside), which
# is what llama.cpp assumes; Gemma 3's five-to-one window pattern needs six layers.
# Gemma 2's attention cap is small here so that the file's value visibly matters.
OVERRIDES: dict[str, dict[str, Any]] = {
    "phi3": {},
    "gemma2": {"attn_logit_softcapping": 3.0},
    "gemma3": {"query_pre_attn_scalar": 16},
}


@pytest.mark.parametrize("family", list(OVERRIDES))
def test_a_family_gguf_computes_what_its_hf_folder_does(tmp_path: Path, family: str) -> None:
    folder = make_family_dir(tmp_path, family, seed=9, **OVERRIDES[family])
    gguf = write_family_gguf(tmp_path / f"{family}.gguf", folder)
    from_folder = architecture_from_config(read_config(folder))
    read = read_architecture(GGUFReader(str(gguf)))
    assert read.architecture == family
    assert [read.layer_window(i) for i in range(read.num_layers)] == [
        from_folder.layer_window(i) for i in range(from_folder.num_layers)
    ]
    assert read.attention_softcap == from_folder.attention_softcap
    assert read.final_logit_softcap == from_folder.final_logit_softcap
    ours, _ = load_gguf_model(str(gguf), dtype=torch.float32, device="cpu")
    theirs = load_model(str(folder), dtype=torch.float32, device="cpu").model
    ids = list(range(700, 730))  # past Gemma's window of 8
    torch.testing.assert_close(
        ModelStepper(ours, block_size=4).step([ids]),
        ModelStepper(theirs, block_size=4).step([ids]),
        atol=1e-4,
        rtol=1e-4,
    )


def test_a_gemma2_gguf_without_caps_or_window_gets_llama_cpps_defaults(tmp_path: Path) -> None:
    """llama.cpp runs a Gemma 2 file that leaves out the caps and the window with 50, 30
    and 4096, on the even layers; so do we."""
    folder = make_family_dir(tmp_path, "gemma2", seed=9, sliding_window=None)
    gguf = write_family_gguf(tmp_path / "gemma2.gguf", folder, caps=False)
    read = read_architecture(GGUFReader(str(gguf)))
    assert (read.attention_softcap, read.final_logit_softcap) == (50.0, 30.0)
    assert [read.layer_window(i) for i in range(read.num_layers)] == [4096, None, 4096, None]
    assert read.attention_scale is None  # head_dim ** -0.5 below the 27B
