"""`weight_quant=auto`: each model file's own fast path on the CPU, float elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from engine.engine_builder import build_config
from engine.llm_engine import LLMEngine
from engine.model.hf_loader import architecture_from_config
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import default_model_path, load_model
from engine.model.quant import (
    WeightQuantUnavailableError,
    choose_weight_quant,
    gguf_decoder_storage,
    resolve_weight_quant,
)
from tests.engine.model.gguf_files import (
    finish_gguf,
    write_model_gguf,
    write_random_blocks_gguf,
)
from tests.utils.tiny_model import make_tiny_model_dir, random_state_dict, tiny_config

Q = GGMLQuantizationType


def test_auto_picks_int4_for_the_bundled_q4_1_model_on_a_cpu() -> None:
    choice = choose_weight_quant(default_model_path(), "cpu")
    assert (choice.mode, choice.describe()) == ("int4", "int4 (auto, from Q4_1 GGUF)")


def test_auto_stays_float_off_the_cpu() -> None:
    """On CUDA, as before `auto`: the int8/int4 kernels are the CPU's only."""
    assert choose_weight_quant(default_model_path(), "cuda").describe() == "none (auto, on cuda)"


def test_auto_stays_float_for_a_hugging_face_folder(tmp_path: Path) -> None:
    folder = make_tiny_model_dir(tmp_path)
    choice = choose_weight_quant(folder, "cpu")
    assert (choice.mode, choice.reason) == ("none", "Hugging Face folder")


@pytest.mark.parametrize(
    ("qtype", "mode"),
    [(Q.F32, "none"), (Q.F16, "none"), (Q.Q8_0, "int8"), (Q.Q4_0, "int4"), (Q.Q4_1, "int4")],
)
def test_auto_follows_the_gguf_storage_type(tmp_path: Path, qtype: Q, mode: str) -> None:
    arch = architecture_from_config(tiny_config())
    path = write_model_gguf(tmp_path / "m.gguf", arch, random_state_dict(arch, seed=1), qtype=qtype)
    choice = choose_weight_quant(path, "cpu")
    assert choice.mode == mode
    assert choice.reason == f"from {qtype.name} GGUF"


@pytest.mark.parametrize(
    ("mix", "mode"),
    [
        # llama.cpp's Q4_K_M: Q6_K for v, down and the head, Q4_K (most weights) elsewhere.
        ({".v_proj.": Q.Q6_K, ".down_proj.": Q.Q6_K, "": Q.Q4_K}, "int4"),
        ({"": Q.Q6_K}, "int8"),
        ({"": Q.Q5_K}, "int8"),
    ],
)
def test_auto_follows_the_type_storing_most_of_a_k_quant_mix(
    tmp_path: Path, mix: dict[str, Q], mode: str
) -> None:
    arch = architecture_from_config(tiny_config(hidden=256, intermediate=512))
    names = {
        n: tuple(p.shape)
        for n, p in LlamaForCausalLM.empty(
            arch, dtype=torch.float32, device="meta"
        ).named_parameters()
    }

    def qtype_of(name: str) -> Q:
        return next(q for part, q in mix.items() if part in name)

    write_random_blocks_gguf(tmp_path / "m.gguf", arch, names, qtype_of)
    assert choose_weight_quant(tmp_path / "m.gguf", "cpu").mode == mode


def test_auto_stays_float_for_mixture_of_experts(tmp_path: Path) -> None:
    """The quantized linears are dense only (experts refuse them), so `auto` keeps float."""
    writer = GGUFWriter(str(tmp_path / "moe.gguf"), "qwen3moe")
    q4 = quantize(np.zeros((64, 256), dtype=np.float32), Q.Q4_0)
    writer.add_tensor("blk.0.attn_q.weight", q4, raw_dtype=Q.Q4_0)
    writer.add_tensor("blk.0.ffn_gate_exps.weight", np.zeros((2, 8, 32), dtype=np.float32))
    finish_gguf(writer)
    choice = choose_weight_quant(tmp_path / "moe.gguf", "cpu")
    assert (choice.mode, choice.reason) == ("none", "mixture of experts")


def test_the_header_scan_agrees_with_gguf_s_reader() -> None:
    """The fast scan of the tensor table reads what gguf's full reader does."""
    path = default_model_path()
    weights: dict[str, int] = {}
    for t in GGUFReader(path).tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:
            weights[t.tensor_type.name] = weights.get(t.tensor_type.name, 0) + int(t.n_elements)
    assert gguf_decoder_storage(path).weights == weights == {"Q4_1": 106168320}


def test_bad_settings_and_devices_are_refused_by_name() -> None:
    with pytest.raises(WeightQuantUnavailableError, match="must be auto, none, int8 or int4"):
        resolve_weight_quant("fast", "", "cpu")
    with pytest.raises(WeightQuantUnavailableError, match="CPU only"):
        resolve_weight_quant("int4", "", "cuda")
    assert resolve_weight_quant("int8", "", "cpu") == ("int8", None)  # no file read


def test_the_engine_resolves_auto_at_load(tmp_path: Path) -> None:
    folder = str(make_tiny_model_dir(tmp_path))
    options = {"device": "cpu", "max_model_len": 64, "kv_cache_bytes": 1 << 20}
    engine = LLMEngine(build_config(folder, weight_quant="auto", **options))
    assert engine.loaded.model.weight_quant == "none"


@pytest.mark.slow  # loads the bundled SmolLM2 (a few seconds)
def test_the_engine_runs_the_bundled_model_on_int4_under_auto(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loaded = load_model(None, dtype=torch.float32, device="cpu")
    options = {"device": "cpu", "max_model_len": 64, "kv_cache_bytes": 1 << 20}
    with caplog.at_level("INFO", logger="engine"):
        engine = LLMEngine(build_config(None, weight_quant="auto", **options), loaded)
    assert engine.loaded.model.weight_quant == "int4"
    assert "weights int4 (auto, from Q4_1 GGUF)" in caplog.text
