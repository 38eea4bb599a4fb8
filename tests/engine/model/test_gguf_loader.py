"""GGUF loading: dequantization, Q/K un-permutation, name mapping and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.errors import UnsupportedModelError
from engine.model.gguf_loader import (
    dequantize_tensor,
    iter_weights,
    load_gguf_model,
    read_architecture,
    unpermute_qk,
)
from engine.model.hf_loader import architecture_from_config
from tests.engine.model.gguf_files import (
    RANDOM_BLOCK_TYPES,
    llama_cpp_permute,
    random_blocks,
    write_model_gguf,
    write_random_blocks_gguf,
    write_single_tensor_gguf,
)
from tests.utils.hf_families import family_config
from tests.utils.model_step import ModelStepper
from tests.utils.tiny_model import random_state_dict, tiny_config

Q = GGMLQuantizationType


def _half_step(blocks: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Worst error per 32-value block: half a quantization step (+ fp16 scale slack).

    Q4_0 levels run from -8 to +7 steps of the signed absmax, so the side opposite
    the absmax may clip by a whole step.
    """
    absmax = np.abs(blocks).max(-1, keepdims=True)
    span = blocks.max(-1, keepdims=True) - blocks.min(-1, keepdims=True)
    step = {Q.Q8_0: absmax / 127, Q.Q4_0: 2 * absmax / 8, Q.Q4_1: span / 15}[qtype]
    return 0.5 * step * 1.01 + 1e-3


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_1, Q.Q4_0])
def test_dequantized_weights_are_close_to_the_originals(
    tmp_path: Path, qtype: GGMLQuantizationType
) -> None:
    rng = np.random.default_rng(0)
    original = rng.standard_normal((8, 64)).astype(np.float32)
    path = write_single_tensor_gguf(tmp_path / "t.gguf", "blk.0.ffn_up.weight", original, qtype)
    (tensor,) = GGUFReader(str(path)).tensors
    loaded = dequantize_tensor(tensor)
    assert loaded.shape == (8, 64)
    assert loaded.dtype == np.float32
    error = np.abs(loaded - original)
    if qtype == Q.F32:
        assert error.max() == 0
    elif qtype == Q.F16:
        assert 0 < error.max() < 1e-3
    else:
        blocks = original.reshape(-1, 32)
        assert (error.reshape(-1, 32) <= _half_step(blocks, qtype)).all()
        assert error.max() > 1e-3  # it really was quantized


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path: Path) -> None:
    raw = np.zeros((4, 66), dtype=np.uint8)  # one IQ2_XXS block (256 values) per row
    path = write_single_tensor_gguf(tmp_path / "iq2.gguf", "blk.0.ffn_up.weight", raw, Q.IQ2_XXS)
    (tensor,) = GGUFReader(str(path)).tensors
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.ffn_up\.weight.*IQ2_XXS"):
        dequantize_tensor(tensor)


@pytest.mark.parametrize("qtype", RANDOM_BLOCK_TYPES, ids=lambda t: t.name)
def test_block_types_decode_as_ggufs_own_dequantizer_does(
    tmp_path: Path, qtype: GGMLQuantizationType
) -> None:
    raw = random_blocks((6, 512), qtype, np.random.default_rng(int(qtype)))
    path = write_single_tensor_gguf(tmp_path / "t.gguf", "blk.0.ffn_up.weight", raw, qtype)
    (tensor,) = GGUFReader(str(path)).tensors
    loaded = dequantize_tensor(tensor)
    assert loaded.shape == (6, 512)
    np.testing.assert_array_equal(loaded, dequantize(raw, qtype))
    assert np.isfinite(loaded).all() and 0.05 < np.abs(loaded).mean() < 1


def _q4_k_m(name: str) -> GGMLQuantizationType:
    """llama.cpp's Q4_K_M mix, in short: Q6_K for v, down and the head, Q4_K elsewhere."""
    sixes = (".v_proj.", ".down_proj.", "lm_head", "embed_tokens")
    return Q.Q6_K if any(part in name for part in sixes) else Q.Q4_K


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_k_quant_mix_model_computes_what_its_decoded_weights_do(
    tmp_path: Path, family: str
) -> None:
    from engine.model.llama import LlamaForCausalLM

    config = family_config(family, hidden_size=256, intermediate_size=512, head_dim=64)
    arch = architecture_from_config(config.to_dict())
    names = {
        n: tuple(p.shape)
        for n, p in LlamaForCausalLM.empty(
            arch, dtype=torch.float32, device="meta"
        ).named_parameters()
    }
    decoded = write_random_blocks_gguf(tmp_path / "m.gguf", arch, names, _q4_k_m)
    model, read = load_gguf_model(str(tmp_path / "m.gguf"), dtype=torch.float32, device="cpu")
    assert read == arch
    if family == "llama":  # the file's Q/K rows are in llama.cpp's rotary order
        for name, heads in ((".q_proj.", arch.num_heads), (".k_proj.", arch.num_kv_heads)):
            for key in [k for k in decoded if name in k]:
                decoded[key] = torch.from_numpy(unpermute_qk(decoded[key].numpy(), heads))
    reference = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="cpu")
    reference.load_weights(decoded.items())
    ids = list(range(300, 311))
    torch.testing.assert_close(ModelStepper(model).step([ids]), ModelStepper(reference).step([ids]))


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    array = np.ones((2, 32), dtype=np.float32)
    path = write_single_tensor_gguf(tmp_path / "g.gguf", "x.weight", array, Q.F32, arch="gpt2")
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        read_architecture(GGUFReader(str(path)))
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        load_gguf_model(str(path), dtype=torch.float32, device="cpu")


def test_unpermute_inverts_llama_cpp_permutation() -> None:
    weight = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)
    permuted = llama_cpp_permute(weight, 6)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(unpermute_qk(permuted, 6), weight)


@pytest.mark.parametrize("qwen2", [False, True])
def test_tiny_model_round_trips_through_gguf(tmp_path: Path, qwen2: bool) -> None:
    config = tiny_config(tie=False, qwen2=qwen2, kv_heads=2)
    arch = architecture_from_config(config)
    state = random_state_dict(arch, seed=5)
    # llama.cpp permutes Q/K only for llama; qwen2 files keep HF's row order.
    path = write_model_gguf(tmp_path / "m.gguf", arch, state, permute_qk=not qwen2)

    reader = GGUFReader(str(path))
    read = read_architecture(reader)
    assert read == arch
    loaded = dict(iter_weights(reader, read))
    assert set(loaded) == set(state)
    for name, tensor in state.items():
        torch.testing.assert_close(loaded[name], tensor, atol=0, rtol=0, msg=name)


def test_gguf_model_computes_what_the_original_does(tmp_path: Path) -> None:
    from engine.model.llama import LlamaForCausalLM

    arch = architecture_from_config(tiny_config(tie=True))
    state = random_state_dict(arch, seed=2)
    reference = LlamaForCausalLM.empty(arch, dtype=torch.float32, device="cpu")
    reference.load_weights(state.items())
    path = write_model_gguf(tmp_path / "m.gguf", arch, state)
    model, read = load_gguf_model(str(path), dtype=torch.float32, device="cpu")
    assert read.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = [10, 20, 30, 40, 50]
    torch.testing.assert_close(ModelStepper(model).step([ids]), ModelStepper(reference).step([ids]))


def test_q8_model_stays_close_to_float(tmp_path: Path) -> None:
    arch = architecture_from_config(tiny_config(tie=False))
    state = random_state_dict(arch, seed=4)
    f32, _ = load_gguf_model(
        str(write_model_gguf(tmp_path / "f.gguf", arch, state)), dtype=torch.float32, device="cpu"
    )
    q8, _ = load_gguf_model(
        str(write_model_gguf(tmp_path / "q.gguf", arch, state, qtype=Q.Q8_0)),
        dtype=torch.float32,
        device="cpu",
    )
    ids = list(range(200, 216))
    a, b = ModelStepper(f32).step([ids]), ModelStepper(q8).step([ids])
    assert 0 < (a - b).abs().max() < 0.05 * a.abs().max()
