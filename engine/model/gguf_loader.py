"""Load a model from a GGUF file, dequantized to the requested dtype.

The family (engine.model.registry) comes from `general.architecture`. GGUF names
tensors llama.cpp's way (`blk.3.attn_q.weight`); they are renamed to Hugging Face's
(`model.layers.3.self_attn.q_proj.weight`) so one `load_weights` serves both formats.
llama.cpp's converter reorders the rows of Llama's Q and K projections for its
interleaved rotary; we undo that to get HF's "rotate half" layout.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize
from tqdm import tqdm

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.families.base import Family
from engine.model.llama import LlamaForCausalLM
from engine.model.registry import family_named, family_of_gguf
from engine.model.rope import RopePairs, rope_settings

# Every type gguf's own dequantizers read that llama.cpp's quantize offers for whole
# models: the legacy block types, the K-quants (Q4_K_M and Q5_K_M files mix Q4_K/Q5_K
# with Q6_K) and the non-linear 4-bit ones.
SUPPORTED_TENSOR_TYPES = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.IQ4_NL,
        GGMLQuantizationType.IQ4_XS,
    }
)

_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
ROPE_FREQS = "rope_freqs.weight"
# Phi-3 LongRoPE's per-pair factors: rotary settings, read with the metadata.
ROPE_FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")
# llama.cpp writes some mixture-of-experts families under their dense sibling's name
# (Mixtral as `llama`), telling them apart by `{arch}.expert_count`.
_EXPERTS_UNDER = {"llama": "mixtral"}


def open_gguf(path: str) -> GGUFReader:
    """The file's reader; a truncated or corrupt file is refused by name."""
    try:
        return GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise UnsupportedModelError(f"cannot read {path} as GGUF: {exc}") from exc


def field_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A metadata value as a plain Python value (str, number, list), or `default`."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_family(reader: GGUFReader) -> tuple[str, Family]:
    """The `general.architecture` string and its family, refused if we cannot run it."""
    arch = field_value(reader, "general.architecture")
    family = family_of_gguf(arch)
    if arch in _EXPERTS_UNDER and field_value(reader, f"{arch}.expert_count"):
        family = family_named(_EXPERTS_UNDER[arch])
    return str(arch), family


def read_architecture(reader: GGUFReader) -> ModelArchitecture:
    """Maps the `{arch}.*` metadata keys onto ModelArchitecture."""
    arch, family = gguf_family(reader)

    def get(key: str, default: Any = None) -> Any:
        value = field_value(reader, f"{arch}.{key}", default)
        if value is None:
            raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
        return value

    for tensor in reader.tensors:  # refused here, before any weight is read
        check_tensor_type(tensor)
    hidden = int(get("embedding_length"))
    num_heads = int(get("attention.head_count"))
    names = {t.name for t in reader.tensors}
    layers = int(get("block_count"))
    fields: dict[str, Any] = dict(
        vocab_size=_vocab_size(reader, arch),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=layers,
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=int(get("attention.key_length", hidden // num_heads)),
        rms_norm_eps=_decimal(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=_decimal(get("rope.freq_base", 10000.0)),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings="output.weight" not in names,
        rope_scaling=_rope_scaling(reader, arch),
        attention_bias="blk.0.attn_q.bias" in names,
        output_bias="blk.0.attn_output.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        sliding_window=_window(field_value(reader, f"{arch}.attention.sliding_window")),
        architecture=family.name,
    )

    def optional(key: str, default: Any = None) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    return ModelArchitecture(**{**fields, **family.gguf_traits(optional, layers)})


def _window(value: Any) -> int | None:
    """llama.cpp writes 0 (or nothing) for no window."""
    return int(value) if value else None


def _decimal(value: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-5, not 9.99e-6).

    That recovers the number the converter was given, as written in the HF config.
    """
    return float(str(np.float32(value)))


def _vocab_size(reader: GGUFReader, arch: str) -> int:
    """From the token list; the embedding's row count wins if the vocab was padded."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else field_value(reader, f"{arch}.vocab_size")
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            # GGUF shapes list the fastest-varying dimension first: [hidden, vocab].
            return int(t.shape[-1])
    if vocab is None:
        raise UnsupportedModelError("GGUF file has neither a token list nor token_embd.weight")
    return int(vocab)


def _rope_scaling(reader: GGUFReader, arch: str) -> RopePairs | None:
    """`{arch}.rope.scaling.*` -> HF-style pairs. Llama 3 instead ships a rope_freqs tensor."""
    if arch == "phi3":
        return _phi3_rope(reader)
    kind = field_value(reader, f"{arch}.rope.scaling.type")
    if kind is None or kind == "none":
        return None
    pairs: list[tuple[str, float | str]] = [("rope_type", str(kind))]
    factor = field_value(reader, f"{arch}.rope.scaling.factor")
    if factor is not None:
        pairs.append(("factor", _decimal(factor)))
    original = field_value(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        pairs.append(("original_max_position_embeddings", float(original)))
    return tuple(pairs)


def _phi3_rope(reader: GGUFReader) -> RopePairs | None:
    """Phi-3's rotary as llama.cpp's converter stores it: the rotated width in
    `rope.dimension_count` (partial rotary, Phi-4-mini), LongRoPE's factors as the
    `rope_factors_short`/`_long` tensors with `rope.scaling.original_context_length`.

    The pairs are built by `rope_settings` from the HF-shaped settings they came from,
    so the attention factor is transformers' (the file's `rope.scaling.attn_factor` is
    the same number for LongRoPE configs).
    """

    def get(key: str) -> Any:
        return field_value(reader, f"phi3.{key}")

    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length") or int(get("embedding_length")) // heads)
    params: dict[str, Any] = {"rope_type": "default"}
    dims = get("rope.dimension_count")
    if dims is not None and int(dims) != head_dim:
        params["partial_rotary_factor"] = int(dims) / head_dim
        if int(head_dim * params["partial_rotary_factor"]) != int(dims):
            raise UnsupportedModelError(f"phi3.rope.dimension_count {dims} of {head_dim} dims")
    factors = {t.name: t for t in reader.tensors if t.name in ROPE_FACTORS}
    if factors:
        if len(factors) != len(ROPE_FACTORS) or get("rope.scaling.original_context_length") is None:
            raise UnsupportedModelError(
                "a Phi-3 GGUF with LongRoPE needs both rope_factors_long.weight and "
                "rope_factors_short.weight and phi3.rope.scaling.original_context_length"
            )
        params["rope_type"] = "longrope"
        for kind, name in zip(("long_factor", "short_factor"), ROPE_FACTORS, strict=True):
            params[kind] = dequantize_tensor(factors[name]).reshape(-1).tolist()
    config = {
        "rope_parameters": params,
        "max_position_embeddings": int(get("context_length")),
        "original_max_position_embeddings": get("rope.scaling.original_context_length"),
    }
    return rope_settings(config)[1]


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverts llama.cpp's rotary row permutation for one Q or K weight (or bias).

    The converter maps HF rows, viewed as [head, 2, pair, ...], to [head, pair, 2, ...];
    here rows are viewed as [head, pair, 2, ...] and the two axes swapped back.
    """
    pairs = weight.shape[0] // n_head // 2
    w = weight.reshape(n_head, pairs, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def hf_name(gguf_name: str, family: Family | None = None) -> str:
    """llama.cpp tensor name -> HF parameter name (with the family's own block names);
    unknown names raise."""
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    match = _BLOCK_RE.match(gguf_name)
    names = _BLOCK_NAMES if family is None else {**_BLOCK_NAMES, **family.gguf_block_names}
    if match and match.group(2) in names:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{names[part]}.{kind}"
    raise UnsupportedModelError(f"unexpected GGUF tensor {gguf_name!r}")


def check_tensor_type(tensor: ReaderTensor) -> GGMLQuantizationType:
    """The tensor's type, refused by name unless we can dequantize it."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype not in SUPPORTED_TENSOR_TYPES:
        raise UnsupportedModelError(
            f"GGUF tensor {tensor.name!r} has unsupported type {qtype.name}; "
            f"supported: {', '.join(sorted(t.name for t in SUPPORTED_TENSOR_TYPES))}"
        )
    return qtype


def dequantize_tensor(tensor: ReaderTensor) -> np.ndarray:
    """One tensor as float32 numpy in HF layout ([out, in] for matrices)."""
    qtype = check_tensor_type(tensor)
    array = dequantize(tensor.data, qtype)
    shape = tuple(int(d) for d in reversed(tensor.shape))
    # F32 data is a read-only view of the memory map; torch needs a writable array.
    return np.require(array.reshape(shape), dtype=np.float32, requirements=["C", "W"])


def iter_weights(
    reader: GGUFReader, arch: ModelArchitecture, *, progress: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (HF name, float32 tensor) for every weight, un-permuting Llama's Q and K."""
    family = family_named(arch.architecture)
    tensors = [t for t in reader.tensors if t.name not in (ROPE_FREQS, *ROPE_FACTORS)]
    for tensor in tqdm(tensors, desc="loading weights", unit="tensor", disable=not progress):
        name = hf_name(tensor.name, family)
        array = dequantize_tensor(tensor)
        if family.gguf_permute_qk:
            if ".self_attn.q_proj." in name:
                array = unpermute_qk(array, arch.num_heads)
            elif ".self_attn.k_proj." in name:
                array = unpermute_qk(array, arch.num_kv_heads)
        yield from family.gguf_weights(name, torch.from_numpy(array), arch)


def rope_freq_factors(reader: GGUFReader) -> torch.Tensor | None:
    """llama.cpp's per-frequency divisors (Llama 3 rope scaling), if the file has them."""
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            return torch.from_numpy(dequantize_tensor(tensor).reshape(-1))
    return None


def load_gguf_model(
    path: str,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    progress: bool = False,
) -> tuple[LlamaForCausalLM, ModelArchitecture]:
    """Reads metadata and weights from a GGUF file into a ready, eval-mode model."""
    reader = open_gguf(path)
    arch = read_architecture(reader)
    model = LlamaForCausalLM.empty(
        arch, dtype=dtype, device=device, rope_freq_factors=rope_freq_factors(reader)
    )
    model.load_weights(iter_weights(reader, arch, progress=progress))
    return model, arch
