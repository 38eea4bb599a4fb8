"""GGUF files of the families whose llama.cpp layout differs from Llama's (Phi-3's fused
tensors, Gemma 3's norms and layer pattern) compute what their HF folders compute."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from engine.model.gguf_loader import load_gguf_model, read_architecture
from engine.model.hf_loader import architecture_from_config, read_config
from engine.model.loader import load_model
from tests.engine.model.gguf_files import write_family_gguf
from tests.utils.hf_families import make_family_dir
from tests.utils.model_step import ModelStepper

# Gemma 3's released sizes have query_pre_attn_scalar == head_dim (the 27B aside), which
# is what llama.cpp assumes; its five-to-one window pattern needs six layers.
OVERRIDES = {"phi3": {}, "gemma3": {"query_pre_attn_scalar": 16}}


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
    ours, _ = load_gguf_model(str(gguf), dtype=torch.float32, device="cpu")
    theirs = load_model(str(folder), dtype=torch.float32, device="cpu").model
    ids = list(range(700, 730))  # past Gemma's window of 8
    torch.testing.assert_close(
        ModelStepper(ours, block_size=4).step([ids]),
        ModelStepper(theirs, block_size=4).step([ids]),
        atol=1e-4,
        rtol=1e-4,
    )
