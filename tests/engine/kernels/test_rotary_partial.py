"""The rotary kernel on partial rotary and LongRoPE tables, against the torch path.

The attention layer hands the kernel the rotary slices `q[..., :R]` / `k[..., :R]` of
the projection output and the model's own [max_pos, R/2] tables, so these tests do
exactly that and compare with `RotaryEmbedding.forward`.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.fused_ops import apply_rotary_
from engine.model.rope import RotaryEmbedding
from tests.engine.kernels.batch_factory import DEVICE, DTYPES, dtype_id, tolerance

HEAD_DIM = 32
ORIGINAL = 16


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


def _longrope(partial: float) -> RotaryEmbedding:
    """Phi-4-mini-like rotary: a partial width, LongRoPE factors switching at 16."""
    pairs = int(HEAD_DIM * partial) // 2
    gen = torch.Generator().manual_seed(3)
    scaling = {
        "rope_type": "longrope",
        "partial_rotary_factor": partial,
        "short_factor": tuple((1 + torch.rand(pairs, generator=gen)).tolist()),
        "long_factor": tuple((2 + 8 * torch.rand(pairs, generator=gen)).tolist()),
        "original_max_position_embeddings": float(ORIGINAL),
        "attention_factor": 1.2,
    }
    with torch.device("cpu"):
        rope = RotaryEmbedding(HEAD_DIM, 64, 10000.0, scaling)
    rope.rebuild(DEVICE)
    return rope


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("partial", [0.75, 0.5, 1.0])
def test_kernel_on_the_rotary_slice_matches_the_torch_path(
    partial: float, dtype: torch.dtype
) -> None:
    rope = _longrope(partial)
    r = rope.rotary_dim
    assert r == int(HEAD_DIM * partial) and rope.cos_cache.shape == (64, r // 2)
    # Views into one packed q|k|v row, as the attention layer splits its projection.
    qkv = _randn(6, (4 + 2 + 2) * HEAD_DIM, seed=1, dtype=dtype)
    q = qkv[:, : 4 * HEAD_DIM].view(6, 4, HEAD_DIM)
    k = qkv[:, 4 * HEAD_DIM : 6 * HEAD_DIM].view(6, 2, HEAD_DIM)
    positions = torch.tensor([0, 3, 15, 16, 17, 63], device=DEVICE)  # both sides of 16
    exp_q, exp_k = rope(positions, q, k)
    before = qkv.clone()
    apply_rotary_(q[..., :r], k[..., :r], positions, rope.cos_cache, rope.sin_cache)
    tol = tolerance(dtype)
    torch.testing.assert_close(q.float(), exp_q.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k.float(), exp_k.float(), atol=tol, rtol=tol)
    # The dims past the rotary width, and V, are never written.
    after, old = qkv.view(6, 8, HEAD_DIM), before.view(6, 8, HEAD_DIM)
    assert torch.equal(after[:, :, r:], old[:, :, r:])
    assert torch.equal(after[:, 6:], old[:, 6:])
    if partial < 1.0:
        assert not torch.allclose(after[:, :6, :r], old[:, :6, :r])  # the slice did turn


def test_long_rows_of_the_table_differ_from_the_short_rule() -> None:
    """Positions from `original` on rotate by the long factors (and the mscale scales
    every row): the kernel reads them, so q at 16 differs from a short-only table."""
    rope = _longrope(0.75)
    r = rope.rotary_dim
    short_only = dict(rope.scaling or {})
    short_only["long_factor"] = short_only["short_factor"]
    with torch.device("cpu"):
        plain = RotaryEmbedding(HEAD_DIM, 64, 10000.0, short_only)
    plain.rebuild(DEVICE)
    torch.testing.assert_close(rope.cos_cache[:ORIGINAL], plain.cos_cache[:ORIGINAL])
    assert (rope.cos_cache[ORIGINAL:] - plain.cos_cache[ORIGINAL:]).abs().max() > 0.1
    q = _randn(2, 2, HEAD_DIM, seed=4)
    a, b = q.clone(), q.clone()
    positions = torch.tensor([5, 40], device=DEVICE)
    apply_rotary_(a[..., :r], a[..., :r].clone(), positions, rope.cos_cache, rope.sin_cache)
    apply_rotary_(b[..., :r], b[..., :r].clone(), positions, plain.cos_cache, plain.sin_cache)
    torch.testing.assert_close(a[0], b[0])
    assert (a[1] - b[1]).abs().max() > 1e-2
