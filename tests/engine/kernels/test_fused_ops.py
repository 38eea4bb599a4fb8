"""Fused RMSNorm(+residual), rotary embedding and SiLU-and-mul against torch references."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.common import KernelInputError
from engine.kernels.fused_ops import (
    apply_rotary_,
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rope_cos_sin,
    rotary_ref,
    silu_and_mul,
    silu_and_mul_ref,
)
from tests.engine.kernels.batch_factory import DEVICE, DTYPES, dtype_id, tolerance


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("hidden", [64, 576, 1000])
def test_add_rms_norm_matches_reference(hidden: int, dtype: torch.dtype) -> None:
    x, res = _randn(5, hidden, seed=1, dtype=dtype), _randn(5, hidden, seed=2, dtype=dtype)
    w = _randn(hidden, seed=3, dtype=dtype)
    normed, new_res = fused_add_rms_norm(x, res, w, 1e-5)
    exp_normed, exp_res = fused_add_rms_norm_ref(x, res, w, 1e-5)
    tol = tolerance(dtype)
    torch.testing.assert_close(normed.float(), exp_normed.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(new_res, exp_res, atol=0, rtol=0)


def test_rms_norm_without_residual_and_its_definition() -> None:
    x, w = _randn(3, 576, seed=4), _randn(576, seed=5)
    normed, res = fused_add_rms_norm(x, None, w, 1e-6)
    assert res is x
    # The definition itself: y = x / sqrt(mean(x^2) + eps) * w.
    rms = x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(normed, x / rms * w, atol=1e-5, rtol=1e-5)


def test_add_rms_norm_reads_strided_rows() -> None:
    big = _randn(4, 256, seed=6)
    x = big[:, :128]  # row stride 256
    res = _randn(4, 128, seed=7)
    w = _randn(128, seed=8)
    normed, new_res = fused_add_rms_norm(x, res, w, 1e-5)
    exp_normed, exp_res = fused_add_rms_norm_ref(x, res, w, 1e-5)
    torch.testing.assert_close(normed, exp_normed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(new_res, exp_res)


def _rotary_by_complex(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Independent oracle: pair (i, i + D/2) as one complex number turned by p * inv_freq[i]."""
    half = x.shape[-1] // 2
    inv = 1.0 / theta ** (torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angle = positions.double().cpu()[:, None] * inv[None, :]
    z = torch.complex(x[..., :half].double().cpu(), x[..., half:].double().cpu())
    z = z * torch.polar(torch.ones_like(angle), angle)[:, None, :]
    return torch.cat((z.real, z.imag), dim=-1).float()


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (8, 1, 128)])
def test_rotary_matches_references(
    num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    q = _randn(6, num_heads, head_dim, seed=9, dtype=dtype)
    k = _randn(6, num_kv_heads, head_dim, seed=10, dtype=dtype)
    positions = torch.tensor([0, 1, 5, 17, 100, 255], device=DEVICE)
    cos, sin = (t.to(DEVICE) for t in rope_cos_sin(256, head_dim, 10000.0))
    exp_q, exp_k = rotary_ref(q, positions, cos, sin), rotary_ref(k, positions, cos, sin)
    q0 = q.clone()
    apply_rotary_(q, k, positions, cos, sin)
    tol = tolerance(dtype)
    torch.testing.assert_close(q.float(), exp_q.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(k.float(), exp_k.float(), atol=tol, rtol=tol)
    # Position 0 is the identity; the complex-rotation oracle agrees everywhere.
    torch.testing.assert_close(q[0], q0[0], atol=tol, rtol=tol)
    if dtype == torch.float32:
        oracle = _rotary_by_complex(q0, positions, 10000.0).to(DEVICE)
        torch.testing.assert_close(q, oracle, atol=1e-4, rtol=1e-4)


def test_rotary_accepts_hf_full_width_tables_and_strided_views() -> None:
    cos_h, sin_h = rope_cos_sin(64, 64, 500000.0)
    cos_full = torch.cat((cos_h, cos_h), dim=-1).to(DEVICE)
    sin_full = torch.cat((sin_h, sin_h), dim=-1).to(DEVICE)
    qkv = _randn(4, (4 + 2 + 2) * 64, seed=11)
    q, k = qkv[:, :256].view(4, 4, 64), qkv[:, 256:384].view(4, 2, 64)
    positions = torch.tensor([3, 9, 27, 63], device=DEVICE)
    exp_q = rotary_ref(q.clone(), positions, cos_full, sin_full)
    v_before = qkv[:, 384:].clone()
    apply_rotary_(q, k, positions, cos_full, sin_full)
    torch.testing.assert_close(q, exp_q, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, 384:], v_before)  # the V columns are not touched


def test_rotary_rejects_bad_table_width() -> None:
    q = torch.zeros(2, 2, 64, device=DEVICE)
    bad = torch.zeros(8, 48, device=DEVICE)
    with pytest.raises(KernelInputError):
        apply_rotary_(q, q.clone(), torch.zeros(2, dtype=torch.int64, device=DEVICE), bad, bad)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("inter", [64, 1536, 3000])
def test_silu_and_mul_matches_reference(inter: int, dtype: torch.dtype) -> None:
    x = _randn(3, 2 * inter, seed=inter, dtype=dtype)
    got = silu_and_mul(x)
    assert got.shape == (3, inter)
    tol = tolerance(dtype)
    torch.testing.assert_close(got.float(), silu_and_mul_ref(x).float(), atol=tol, rtol=tol)
    # And the formula itself, spelled out: gate * sigmoid(gate) * up.
    g, u = x[:, :inter].float(), x[:, inter:].float()
    torch.testing.assert_close(got.float(), g / (1 + torch.exp(-g)) * u, atol=tol, rtol=tol)
