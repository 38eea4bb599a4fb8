"""Mixture-of-experts GGUF files (Mixtral, written by llama.cpp as `llama` with experts;
Qwen3-MoE as `qwen3moe`) with each layer's experts stacked in one 3-D tensor per
projection compute what their Hugging Face folders compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import quantize
from safetensors.torch import load_file

from engine.errors import UnsupportedModelError
from engine.model.gguf_loader import load_gguf_model, read_architecture
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import load_model
from engine.model.registry import family_named
from engine.planning.model_source import read_model_facts
from tests.engine.model.gguf_files import (
    finish_gguf,
    gguf_name,
    llama_cpp_permute,
    model_writer,
)
from tests.utils.hf_families import make_family_dir
from tests.utils.model_step import ModelStepper

_GGUF_ARCH = {"mixtral": "llama", "qwen3_moe": "qwen3moe"}
_STACKS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}


def write_moe_gguf(
    path: Path,
    folder: Path,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    *,
    drop_expert: bool = False,
) -> Path:
    """The GGUF llama.cpp's converter writes for a tiny MoE folder: experts stacked
    [experts, rows, cols] per projection, the router as `ffn_gate_inp`, Mixtral's q/k
    rows permuted as for Llama; `qtype` for the stacks (F32 otherwise)."""
    config = json.loads((folder / "config.json").read_text())
    arch = architecture_from_config(config)
    family = family_named(arch.architecture)
    writer = model_writer(path, arch, _GGUF_ARCH[arch.architecture])
    writer.add_expert_count(arch.num_experts)
    writer.add_expert_used_count(arch.num_experts_per_tok)
    if arch.architecture == "qwen3_moe":
        writer.add_expert_feed_forward_length(arch.moe_intermediate_size)
    stacks: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    state = load_file(str(folder / "model.safetensors"))
    for raw, tensor in state.items():
        for name, mapped in family.hf_weights(raw, tensor, arch):
            array = mapped.float().numpy()
            parts = name.split(".")
            if ".mlp.experts." in name:  # model.layers.L.mlp.experts.E.proj.weight
                stacks.setdefault((parts[2], parts[6]), {})[int(parts[5])] = array
                continue
            if arch.architecture == "mixtral" and ".self_attn.q_proj." in name:
                array = llama_cpp_permute(array, arch.num_heads)
            elif arch.architecture == "mixtral" and ".self_attn.k_proj." in name:
                array = llama_cpp_permute(array, arch.num_kv_heads)
            if name.endswith(".mlp.gate.weight"):
                writer.add_tensor(f"blk.{parts[2]}.ffn_gate_inp.weight", array)
            else:
                writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
    for (layer, proj), experts in stacks.items():
        count = arch.num_experts - 1 if drop_expert else arch.num_experts
        stack = np.stack([experts[e] for e in range(count)])
        name = f"blk.{layer}.{_STACKS[proj]}.weight"
        if qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, stack)
        else:
            writer.add_tensor(name, quantize(stack, qtype), raw_dtype=qtype)
    finish_gguf(writer)
    return path


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_moe_gguf_computes_what_its_hf_folder_does(tmp_path: Path, family: str) -> None:
    folder = make_family_dir(tmp_path, family, seed=11, num_hidden_layers=2, mlp_only_layers=[])
    gguf = write_moe_gguf(tmp_path / f"{family}.gguf", folder)
    read = read_architecture(GGUFReader(str(gguf)))
    from_folder = architecture_from_config(json.loads((folder / "config.json").read_text()))
    assert (read.architecture, read.num_experts, read.num_experts_per_tok) == (
        family,
        from_folder.num_experts,
        from_folder.num_experts_per_tok,
    )
    assert read.moe_intermediate_size == from_folder.moe_intermediate_size
    ours, _ = load_gguf_model(str(gguf), dtype=torch.float32, device="cpu")
    theirs = load_model(str(folder), dtype=torch.float32, device="cpu").model
    prompts = [list(range(500, 520)), list(range(900, 907))]
    torch.testing.assert_close(
        ModelStepper(ours, num_seqs=2, block_size=4).step(prompts),
        ModelStepper(theirs, num_seqs=2, block_size=4).step(prompts),
        atol=1e-4,
        rtol=1e-4,
    )
    facts = read_model_facts(gguf)
    assert facts.family == family and facts.experts == (4, 2)


def test_quantized_expert_stacks_decode_close_to_the_float_ones(tmp_path: Path) -> None:
    folder = make_family_dir(tmp_path, "mixtral", seed=12)
    f32 = write_moe_gguf(tmp_path / "f32.gguf", folder)
    q8 = write_moe_gguf(tmp_path / "q8.gguf", folder, GGMLQuantizationType.Q8_0)
    assert "Q8_0" in read_model_facts(q8).quantization
    ids = [list(range(40, 60))]
    exact = ModelStepper(load_gguf_model(str(f32), dtype=torch.float32, device="cpu")[0]).step(ids)
    close = ModelStepper(load_gguf_model(str(q8), dtype=torch.float32, device="cpu")[0]).step(ids)
    assert not torch.equal(exact, close)  # the stacks really went through Q8_0
    assert (exact.argmax(-1) == close.argmax(-1)).float().mean() >= 0.9


def test_a_stack_short_of_an_expert_is_refused_by_name(tmp_path: Path) -> None:
    folder = make_family_dir(tmp_path, "mixtral", seed=13)
    gguf = write_moe_gguf(tmp_path / "short.gguf", folder, drop_expert=True)
    with pytest.raises(UnsupportedModelError, match=r"expert stack .*\[3, .*expected \[4"):
        load_model(str(gguf), dtype=torch.float32, device="cpu")
