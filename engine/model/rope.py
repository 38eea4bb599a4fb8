"""Rotary position embeddings (HF "rotate half" layout) with HF-style rope scaling.

The cos/sin tables are computed once, in float32, for every position up to the
model's context length; a step only indexes them at its flat `positions`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from engine.errors import UnsupportedModelError

RopeScaling = Mapping[str, float | str]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_scaling_dict(
    scaling: tuple[tuple[str, float | str], ...] | None,
) -> dict[str, float | str] | None:
    """Turns ModelArchitecture's frozen pairs back into a dict (None stays None)."""
    return None if scaling is None else dict(scaling)


def rope_type_of(scaling: RopeScaling | None) -> str:
    """The scaling's type; HF configs spell the key `rope_type` or, in older files, `type`."""
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def compute_inv_freq(
    head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2], float32, after rope scaling."""
    # Built on the CPU explicitly so that a meta-device context (model skeletons) is ignored.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = rope_type_of(scaling)
    if rope_type == "default":
        return inv_freq
    assert scaling is not None
    if rope_type == "linear":
        # Dividing the frequency is the same as dividing the position by `factor`.
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise UnsupportedModelError(
        f"rope scaling type {rope_type!r} is not supported; "
        f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
    )


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, a blend between."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context = float(scaling.get("original_max_position_embeddings", 8192))
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to q and k at arbitrary (flat) positions.

    `freq_factors` (llama.cpp's `rope_freqs` tensor in GGUF files) divides each
    pair's frequency, which is how GGUF stores Llama 3 scaling.
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
        self.freq_factors = None if freq_factors is None else freq_factors.float().cpu()
        self.rebuild(torch.get_default_device())

    def rebuild(self, device: torch.device | str) -> None:
        """(Re)computes the float32 cos/sin tables on `device`, e.g. after `to_empty`."""
        inv_freq = compute_inv_freq(self.head_dim, self.theta, self.scaling)
        if self.freq_factors is not None:
            inv_freq = inv_freq / self.freq_factors
        t = torch.arange(self.max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(t, inv_freq)  # [max_positions, head_dim // 2]
        self.register_buffer("cos_cache", freqs.cos().to(device), persistent=False)
        self.register_buffer("sin_cache", freqs.sin().to(device), persistent=False)
        # [max_positions, 2, head_dim]: cos twice, then (-sin, sin), so that a rotation is
        # x * cos + swap_halves(x) * sin, one lookup and four ops (the torch path's layers
        # each rotate, and at decode sizes every op's overhead counts).
        cos, sin = freqs.cos(), freqs.sin()
        table = torch.stack((torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)), 1)
        self.register_buffer("cos_sin_table", table.to(device), persistent=False)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates q [T, Hq, D] and k [T, Hk, D] by their token's position [T]."""
        table = self.cos_sin_table[positions]  # [T, 2, D]
        cos, sin = table[:, 0:1], table[:, 1:2]  # [T, 1, D] each, views
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates the pairs (x[i], x[i + D/2]); done in float32 so low precisions lose nothing.

    With cos = (c, c) and sin = (-s, s) this is (x1 c - x2 s, x2 c + x1 s), the same
    products and sums in the same order as the textbook form, so bit for bit equal.
    """
    half = x.shape[-1] // 2
    x32 = x.float()
    swapped = torch.cat((x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + swapped * sin).to(x.dtype)


def rope_settings(
    config: Mapping[str, Any],
) -> tuple[float, tuple[tuple[str, float | str], ...] | None]:
    """(theta, scaling pairs) of a transformers config; v5 folds both into
    `rope_parameters`, older configs spell them `rope_theta` and `rope_scaling`."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    if params.get("rope_type", "default") == "default":
        return theta, None
    pairs = tuple(
        (str(k), v if isinstance(v, str) else float(v))
        for k, v in sorted(params.items())
        if isinstance(v, str | int | float) and not isinstance(v, bool)
    )
    return theta, pairs
