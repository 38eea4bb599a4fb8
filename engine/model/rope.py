"""Rotary position embeddings (HF "rotate half" layout) with HF-style rope scaling.

The cos/sin tables are computed once, in float32, for every position up to the
model's context length; a step only indexes them at its flat `positions`.

Partial rotary (`partial_rotary_factor`, Phi-4-mini's 0.75) turns only the first
`int(head_dim * factor)` dims of each head, as transformers does; the rest pass
through untouched. The tables are then `rotary_dim` wide, not `head_dim`.

LongRoPE (`rope_type` "longrope", or Phi-3's older "su") divides each pair's
frequency by a per-pair factor, `short_factor` within the pretraining context
(`original_max_position_embeddings`) and `long_factor` beyond it, and scales cos
and sin by an attention factor (mscale). Which factors apply is where we differ
from transformers on purpose; see `longrope_switch`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModelError

# A scaling value: a number, a name, or one of LongRoPE's per-pair factor lists.
RopeValue = float | str | tuple[float, ...]
RopeScaling = Mapping[str, RopeValue]
RopePairs = tuple[tuple[str, RopeValue], ...]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
# Bounds for what a config may declare (a hostile or corrupt one is refused by name):
# released LongRoPE factors lie in [1, ~100], attention factors near 1.
_MAX_ROPE_FACTOR = 1e6
_MAX_ORIGINAL_CONTEXT = 1 << 24
# Phi3Config's default when a config does not say (transformers reads it, not the
# rope dict, for Phi-3).
PHI3_ORIGINAL_CONTEXT = 4096


def rope_scaling_dict(scaling: RopePairs | None) -> dict[str, RopeValue] | None:
    """Turns ModelArchitecture's frozen pairs back into a dict (None stays None)."""
    return None if scaling is None else dict(scaling)


def rope_type_of(scaling: RopeScaling | None) -> str:
    """The scaling's type; HF configs spell the key `rope_type` or, in older files, `type`."""
    if not scaling:
        return "default"
    kind = str(scaling.get("rope_type", scaling.get("type", "default")))
    return "longrope" if kind == "su" else kind  # "su": Phi-3's first name for LongRoPE


def _number(scaling: RopeScaling, key: str, default: float | None = None) -> float:
    """A numeric scaling field, refused by name when it is missing or not a finite number."""
    value = scaling.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UnsupportedModelError(f"rope scaling {key!r} must be a finite number, not {value!r}")
    return float(value)


def _factors(scaling: RopeScaling, key: str) -> tuple[float, ...]:
    """One of LongRoPE's factor lists, refused by name unless all finite positive numbers."""
    value = scaling.get(key)
    # A tuple from `rope_settings`; a list where a caller passes transformers' own dict.
    if not isinstance(value, tuple | list) or not all(
        isinstance(f, int | float) and not isinstance(f, bool) and 0.0 < f <= _MAX_ROPE_FACTOR
        for f in value
    ):
        raise UnsupportedModelError(
            f"LongRoPE {key!r} must be a list of numbers in (0, {_MAX_ROPE_FACTOR:g}]"
        )
    return tuple(float(f) for f in value)


def check_rope_scaling(head_dim: int, scaling: RopeScaling | None) -> int:
    """Validates the scaling for heads of `head_dim`; returns the rotary width.

    The width is `int(head_dim * partial_rotary_factor)` (transformers truncates too);
    it must be even and positive. LongRoPE needs both factor lists with one factor per
    rotated pair, a pretraining context and an attention factor (`rope_settings` fills
    the last two in from the config).
    """
    if not scaling:
        return head_dim
    partial = _number(scaling, "partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * partial)
    if not 0.0 < partial <= 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise UnsupportedModelError(
            f"partial_rotary_factor={partial} gives {rotary_dim} rotary dims of {head_dim}; "
            "it must be in (0, 1] and give an even, positive number"
        )
    rope_type = rope_type_of(scaling)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(_factors(scaling, key)) != rotary_dim // 2:
                raise UnsupportedModelError(
                    f"LongRoPE {key!r} must have {rotary_dim // 2} entries (one per rotary "
                    f"pair), not {len(_factors(scaling, key))}"
                )
        original = _number(scaling, "original_max_position_embeddings")
        if original != int(original) or not 1 <= original <= _MAX_ORIGINAL_CONTEXT:
            raise UnsupportedModelError(
                f"LongRoPE original_max_position_embeddings must be an integer in "
                f"[1, {_MAX_ORIGINAL_CONTEXT}], not {original}"
            )
        if not 0.0 < _number(scaling, "attention_factor") <= _MAX_ROPE_FACTOR:
            raise UnsupportedModelError("LongRoPE attention_factor must be positive")
    return rotary_dim


def compute_inv_freq(
    head_dim: int, theta: float, scaling: RopeScaling | None = None, *, long: bool = False
) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2], float32, after rope scaling.

    `head_dim` is the rotary width (smaller than the head with partial rotary). For
    LongRoPE, `long` picks the long factors instead of the short ones.
    """
    # Built on the CPU explicitly so that a meta-device context (model skeletons) is ignored.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = rope_type_of(scaling)
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        # Dividing the frequency is the same as dividing the position by `factor`.
        return inv_freq / _number(scaling, "factor")
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if rope_type == "longrope":
        key = "long_factor" if long else "short_factor"
        factors = torch.tensor(_factors(scaling, key), dtype=torch.float32, device="cpu")
        # transformers' order of operations: 1 / (factor * theta ** (2i / d)).
        return 1.0 / (factors * theta**exponents)
    raise UnsupportedModelError(
        f"rope scaling type {rope_type!r} is not supported; "
        f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a blend between."""
    factor = _number(scaling, "factor")
    low_freq_factor = _number(scaling, "low_freq_factor", 1.0)
    high_freq_factor = _number(scaling, "high_freq_factor", 4.0)
    old_context = _number(scaling, "original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def longrope_switch(scaling: RopeScaling) -> int:
    """The first position whose rotary uses LongRoPE's long factors.

    transformers picks one factor set per forward call from the sequence length: long
    when max position + 1 > original_max_position_embeddings, for every token of the
    call. Our KV cache is paged and the prefix cache is keyed by token content, so a
    key's rotary must depend on its position alone. We therefore switch per position:
    a token at position p uses the long factors when p >= original_max_position_embeddings
    (the p + 1 > original of a transformers decode step at p), the short ones before.

    What that matches in transformers:
    - a sequence (prompt and output) within the original context: everything short,
      identical to `generate`;
    - a prompt within it, decoded past it on transformers' KV cache one call per
      token: identical (each new token long from the boundary on, cached keys keep the
      short rotary they were written with). Phi-3's `generate`, though, drops its cache
      the first time the sequence grows past the boundary and recomputes every earlier
      key with the long factors, so from that token on it differs from us;
    - a prompt longer than the original context: transformers rotates all of it with
      the long factors, we keep the short ones for its first `original` positions.
    vLLM matches transformers in neither of the last two cases either (older releases
    switched a whole batch to long when any position passed the boundary; current ones
    use the long factors everywhere once max_model_len exceeds the original context).
    """
    return int(_number(scaling, "original_max_position_embeddings"))


def attention_factor_of(scaling: RopeScaling | None) -> float:
    """What cos and sin are multiplied by (LongRoPE's mscale); 1 for other types."""
    if rope_type_of(scaling) != "longrope":
        return 1.0
    assert scaling is not None
    return _number(scaling, "attention_factor")


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to q and k at arbitrary (flat) positions.

    `freq_factors` (llama.cpp's `rope_freqs` tensor in GGUF files) divides each
    pair's frequency, which is how GGUF stores Llama 3 scaling. With partial rotary
    only the first `rotary_dim` dims of each head turn; the tables are that wide.
    """

    cos_cache: torch.Tensor
    sin_cache: torch.Tensor
    cos_sin_table: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: RopeScaling | None = None,
        freq_factors: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise UnsupportedModelError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.theta = theta
        self.scaling = dict(scaling) if scaling else None
        self.rotary_dim = check_rope_scaling(head_dim, self.scaling)
        self.freq_factors = None if freq_factors is None else freq_factors.float().cpu()
        self.rebuild(torch.get_default_device())

    def rebuild(self, device: torch.device | str) -> None:
        """(Re)computes the float32 cos/sin tables on `device`, e.g. after `to_empty`."""
        inv_freq = self._inv_freq(long=False)
        t = torch.arange(self.max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, inv_freq)  # [max_positions, rotary_dim // 2]
        if rope_type_of(self.scaling) == "longrope":
            assert self.scaling is not None
            switch = min(longrope_switch(self.scaling), self.max_positions)
            freqs[switch:] = torch.outer(t[switch:], self._inv_freq(long=True))
        mscale = attention_factor_of(self.scaling)
        cos, sin = freqs.cos() * mscale, freqs.sin() * mscale
        self.register_buffer("cos_cache", cos.to(device), persistent=False)
        self.register_buffer("sin_cache", sin.to(device), persistent=False)
        # [max_positions, 2, rotary_dim]: cos twice, then (-sin, sin), so that a rotation
        # is x * cos + swap_halves(x) * sin, one lookup and four ops (the torch path's
        # layers each rotate, and at decode sizes every op's overhead counts).
        table = torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), 1)
        self.register_buffer("cos_sin_table", table.to(device), persistent=False)

    def _inv_freq(self, *, long: bool) -> torch.Tensor:
        inv_freq = compute_inv_freq(self.rotary_dim, self.theta, self.scaling, long=long)
        return inv_freq if self.freq_factors is None else inv_freq / self.freq_factors

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates q [T, Hq, D] and k [T, Hk, D] by their token's position [T]."""
        table = self.cos_sin_table[positions]  # [T, 2, R]
        cos, sin = table[:, 0:1], table[:, 1:2]  # [T, 1, R] each, views
        r = self.rotary_dim
        if r == self.head_dim:
            return _rotate(q, cos, sin), _rotate(k, cos, sin)
        return (
            torch.cat((_rotate(q[..., :r], cos, sin), q[..., r:]), -1),
            torch.cat((_rotate(k[..., :r], cos, sin), k[..., r:]), -1),
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the pairs (x[i], x[i + D/2]); done in float32 so low precisions lose nothing.

    With cos = (c, c) and sin = (-s, s) this is (x1 c - x2 s, x2 c + x1 s), the same
    products and sums in the same order as the textbook form, so bit for bit equal.
    """
    half = x.shape[-1] // 2
    x32 = x.float()
    swapped = torch.cat((x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + swapped * sin).to(x.dtype)


def rope_settings(config: Mapping[str, Any]) -> tuple[float, RopePairs | None]:
    """(theta, scaling pairs) of a transformers config; v5 folds both into
    `rope_parameters`, older configs spell them `rope_theta` and `rope_scaling`.

    A partial rotary factor other than 1 (from the rope dict, else the config's top
    level, transformers' order) joins the pairs, with rope_type "default" if there is
    no scaling. LongRoPE's pairs get their pretraining context and attention factor
    resolved here, where the config's context lengths are known.
    """
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    named, legacy = params.pop("rope_type", None), params.pop("type", None)
    params["rope_type"] = rope_type_of({"rope_type": str(named or legacy or "default")})
    partial = params.pop("partial_rotary_factor", None)
    if partial is None:
        partial = config.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        params["partial_rotary_factor"] = partial
    elif params["rope_type"] == "default":
        return theta, None
    if params["rope_type"] == "longrope":
        _resolve_longrope(config, params)
    return theta, tuple(
        (str(k), pair_value)
        for k, v in sorted(params.items())
        if (pair_value := _pair_value(str(k), v)) is not None
    )


def _pair_value(key: str, value: Any) -> RopeValue | None:
    """A config value as a pair's value: numbers as floats, lists of numbers as tuples;
    anything else (nested dicts, nulls) is left out."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Sequence):
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise UnsupportedModelError(f"rope scaling {key!r} must be a list of numbers")
        return tuple(float(v) for v in value)
    return None


def _resolve_longrope(config: Mapping[str, Any], params: dict[str, Any]) -> None:
    """Fills in `original_max_position_embeddings` and `attention_factor` as transformers
    does: the config's top-level original context wins over the rope dict's (Phi-3
    keeps it there), and without an explicit attention factor it is
    sqrt(1 + ln(factor) / ln(original)), factor defaulting to max / original context."""
    original = config.get("original_max_position_embeddings")
    if original is None:
        original = params.get("original_max_position_embeddings")
    if original is None:
        original = config.get("max_position_embeddings")
    if isinstance(original, bool) or not isinstance(original, int | float) or original < 1:
        raise UnsupportedModelError(
            f"LongRoPE needs original_max_position_embeddings >= 1, not {original!r}"
        )
    params["original_max_position_embeddings"] = original
    if params.get("attention_factor") is not None:
        return
    factor = params.get("factor")
    if factor is None:
        factor = float(config.get("max_position_embeddings", original)) / original
    factor = float(factor)
    # (An original context of 1 would divide by log(1) = 0; no model has one.)
    params["attention_factor"] = (
        1.0
        if factor <= 1.0 or original <= 1
        else math.sqrt(1 + math.log(factor) / math.log(original))
    )
