"""Writes small GGUF files for tests, the way llama.cpp's converter lays them out."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from engine.config import ModelArchitecture

_HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
_HF_TO_GGUF_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


# Byte offsets of each block's float16 scales, and the largest integer factor a scale
# is multiplied by, so that random blocks decode to weights of about unit size.
_SCALE_FIELDS: dict[GGMLQuantizationType, tuple[tuple[int, ...], int]] = {
    GGMLQuantizationType.Q5_0: ((0,), 16),
    GGMLQuantizationType.Q5_1: ((0, 2), 31),
    GGMLQuantizationType.Q2_K: ((80, 82), 45),
    GGMLQuantizationType.Q3_K: ((108,), 128),
    GGMLQuantizationType.Q4_K: ((0, 2), 945),
    GGMLQuantizationType.Q5_K: ((0, 2), 1953),
    GGMLQuantizationType.Q6_K: ((208,), 4064),
    GGMLQuantizationType.IQ4_NL: ((0,), 127),
    GGMLQuantizationType.IQ4_XS: ((0,), 4064),
}
RANDOM_BLOCK_TYPES = tuple(_SCALE_FIELDS)


def random_blocks(
    shape: tuple[int, int], qtype: GGMLQuantizationType, rng: np.random.Generator
) -> np.ndarray:
    """Raw `qtype` blocks for a [rows, cols] tensor: random quants, sane float16 scales.

    gguf has no quantizer for these types; random blocks decoded by its own
    dequantizer are as good a reference for a loader.
    """
    block, size = GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    offsets, factor = _SCALE_FIELDS[qtype]
    for offset in offsets:
        scale = (rng.uniform(0.5, 1.5, size=raw.shape[:2]) / factor).astype(np.float16)
        raw[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: rows viewed as [head, 2, pair] become [head, pair, 2]."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_name(hf_name: str) -> str:
    """HF parameter name -> llama.cpp tensor name."""
    if hf_name in _HF_TO_GGUF_TOP:
        return _HF_TO_GGUF_TOP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_HF_TO_GGUF_BLOCK[module]}.{kind}"


def add_tensor(
    writer: GGUFWriter, name: str, array: np.ndarray, qtype: GGMLQuantizationType
) -> None:
    """Adds a float32 array stored as `qtype` (quantized when it is a block type)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if qtype == GGMLQuantizationType.F32:
        writer.add_tensor(name, array)
    elif qtype == GGMLQuantizationType.F16:
        writer.add_tensor(name, array.astype(np.float16))
    else:
        writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)


def write_model_gguf(
    path: Path,
    arch: ModelArchitecture,
    state: Mapping[str, torch.Tensor],
    *,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    permute_qk: bool = True,
    raw: Mapping[str, tuple[np.ndarray, GGMLQuantizationType]] | None = None,
) -> Path:
    """A full model file: metadata from `arch`, 2-D weights stored as `qtype`, norms F32;
    the tensors named in `raw` are written as those bytes of that type instead."""
    writer = model_writer(path, arch)
    for name, tensor in state.items():
        if raw and name in raw:
            writer.add_tensor(gguf_name(name), raw[name][0], raw_dtype=raw[name][1])
            continue
        array = tensor.float().numpy()
        if permute_qk and ".q_proj." in name:
            array = llama_cpp_permute(array, arch.num_heads)
        elif permute_qk and ".k_proj." in name:
            array = llama_cpp_permute(array, arch.num_kv_heads)
        add_tensor(
            writer, gguf_name(name), array, qtype if array.ndim == 2 else GGMLQuantizationType.F32
        )
    finish_gguf(writer)
    return path


def write_random_blocks_gguf(
    path: Path,
    arch: ModelArchitecture,
    names: Mapping[str, tuple[int, ...]],
    qtype_of: Callable[[str], GGMLQuantizationType],
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A model file (no Q/K permutation) whose 2-D weights are random `qtype_of(name)`
    blocks and whose 1-D ones are F32 near 1; returns the weights the blocks decode to,
    by gguf's own dequantizer, in HF naming."""
    rng = np.random.default_rng(seed)
    writer = model_writer(path, arch)
    decoded: dict[str, torch.Tensor] = {}
    for name, shape in names.items():
        if len(shape) == 2:
            qtype = qtype_of(name)
            raw = random_blocks((shape[0], shape[1]), qtype, rng)
            writer.add_tensor(gguf_name(name), raw, raw_dtype=qtype)
            array = dequantize(raw, qtype).reshape(shape)
        else:
            array = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            writer.add_tensor(gguf_name(name), array)
        decoded[name] = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    finish_gguf(writer)
    return decoded


def model_writer(path: Path, arch: ModelArchitecture, name: str | None = None) -> GGUFWriter:
    """A writer with `arch`'s metadata set (under llama.cpp's architecture `name`,
    default our family's), tensors still to add."""
    writer = GGUFWriter(str(path), name or arch.architecture)
    writer.add_block_count(arch.num_layers)
    writer.add_context_length(arch.max_position_embeddings)
    writer.add_embedding_length(arch.hidden_size)
    writer.add_feed_forward_length(arch.intermediate_size)
    writer.add_head_count(arch.num_heads)
    writer.add_head_count_kv(arch.num_kv_heads)
    writer.add_key_length(arch.head_dim)
    writer.add_value_length(arch.head_dim)
    writer.add_layer_norm_rms_eps(arch.rms_norm_eps)
    writer.add_rope_freq_base(arch.rope_theta)
    return writer


def finish_gguf(writer: GGUFWriter) -> None:
    """Writes the header, the metadata and the tensors, and closes the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_single_tensor_gguf(
    path: Path,
    name: str,
    array: np.ndarray,
    qtype: GGMLQuantizationType,
    *,
    arch: str = "llama",
) -> Path:
    """A file holding one tensor (plus the architecture key), for dequantization tests."""
    writer = GGUFWriter(str(path), arch)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) or array.dtype != np.uint8:
        add_tensor(writer, name, array, qtype)
    else:
        writer.add_tensor(name, array, raw_dtype=qtype)  # raw bytes of an exotic type
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Hugging Face module names -> llama.cpp's, where a family's converter differs.
_GEMMA_BLOCKS = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_FAMILY_BLOCKS: dict[str, dict[str, str]] = {
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "gemma2": _GEMMA_BLOCKS,
    "gemma3": _GEMMA_BLOCKS,
}


def write_family_gguf(path: Path, folder: Path, *, caps: bool = True) -> Path:
    """The F32 GGUF llama.cpp's converter writes for a tiny HF folder of phi3, gemma2 or
    gemma3: its names, fused Phi-3 tensors kept, Gemma's norms stored as 1 + w, Gemma 2's
    soft caps (left out with `caps=False`, as a file may leave them)."""
    import json

    from safetensors.torch import load_file

    from engine.model.hf_loader import architecture_from_config

    arch = architecture_from_config(json.loads((folder / "config.json").read_text()))
    blocks = {**_HF_TO_GGUF_BLOCK, **_FAMILY_BLOCKS.get(arch.architecture, {})}
    writer = model_writer(path, arch)
    if arch.sliding_window is not None:
        writer.add_sliding_window(arch.sliding_window)
    if arch.architecture == "gemma2" and caps:
        if arch.attention_softcap is not None:
            writer.add_attn_logit_softcapping(arch.attention_softcap)
        if arch.final_logit_softcap is not None:
            writer.add_final_logit_softcapping(arch.final_logit_softcap)
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        array = tensor.float().numpy()
        if arch.architecture in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            array = array + 1.0
        if name in _HF_TO_GGUF_TOP:
            gguf = _HF_TO_GGUF_TOP[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gguf = f"blk.{layer}.{blocks[module]}.{kind}"
        writer.add_tensor(gguf, np.ascontiguousarray(array))
    finish_gguf(writer)
    return path
