"""Fused elementwise kernels of a Llama block, each with its torch reference beside it.

- `fused_add_rms_norm`: residual add + RMSNorm in one pass over the hidden row.
- `apply_rotary_`: rotary position embedding on q and k, in place ("rotate_half" style).
- `silu_and_mul`: SwiGLU's gate: [T, 2*I] -> silu(x[:, :I]) * x[:, I:].

All three compute in fp32 and round once on store, like the references do.
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped; the host
# launchers below are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels.common import KernelInputError, next_pow2, require_last_dim_contiguous

# ---------------------------------------------------------------- RMSNorm (+ residual)


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    h = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        h += tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # The residual stream is kept in the model dtype; normalise the rounded value
        # so the output matches what an unfused add-then-norm would see.
        h_r = h.to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + cols, h_r, mask=mask)
        h = h_r.to(tl.float32)
    var = tl.sum(h * h, 0) / hidden
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = h * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual) * weight, x + residual) for x: [T, hidden].

    With residual None it is a plain RMSNorm and the returned residual is x itself.
    """
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise KernelInputError(f"x {tuple(x.shape)} / weight {tuple(weight.shape)} mismatch")
    require_last_dim_contiguous("x", x)
    if residual is not None:
        if residual.shape != x.shape:
            raise KernelInputError("residual must have x's shape")
        require_last_dim_contiguous("residual", residual)
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    if x.shape[0] == 0:
        return out, res_out
    res_in = residual if residual is not None else x
    _add_rms_norm_kernel[(x.shape[0],)](
        x,
        res_in,
        weight,
        out,
        res_out,
        x.stride(0),
        res_in.stride(0),
        out.stride(0),
        res_out.stride(0),
        x.shape[1],
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=next_pow2(x.shape[1]),
        num_warps=4 if x.shape[1] <= 2048 else 8,
    )
    return out, res_out


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of `fused_add_rms_norm`."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), h


# ---------------------------------------------------------------- rotary embedding


@triton.jit
def _rotary_rows(
    ptr,
    stride_t,
    stride_h,
    tok,
    num_heads,
    c,
    s,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < num_heads) & (i[None, :] < half)
    base = ptr + tok * stride_t + h[:, None] * stride_h + i[None, :]
    x1 = tl.load(base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + half, mask=mask, other=0.0).to(tl.float32)
    # rotate_half(x) = [-x2, x1], so x*cos + rotate_half(x)*sin splits into two halves.
    o1 = x1 * c[None, :] - x2 * s[None, :]
    o2 = x2 * c[None, :] + x1 * s[None, :]
    elem = ptr.dtype.element_ty
    tl.store(base, o1.to(elem), mask=mask)
    tl.store(base + half, o2.to(elem), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cos,
    stride_sin,
    num_q_heads,
    num_k_heads,
    half,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    c = tl.load(cos_ptr + pos * stride_cos + i, mask=i < half, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + pos * stride_sin + i, mask=i < half, other=0.0).to(tl.float32)
    _rotary_rows(q_ptr, stride_qt, stride_qh, tok, num_q_heads, c, s, half, BLOCK_QH, BLOCK_HALF)
    _rotary_rows(k_ptr, stride_kt, stride_kh, tok, num_k_heads, c, s, half, BLOCK_KH, BLOCK_HALF)


def _half_table(name: str, t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Accepts a [max_pos, head_dim/2] table, or HF's [max_pos, head_dim] = cat(half, half)."""
    half = head_dim // 2
    if t.dim() != 2 or t.shape[1] not in (half, head_dim):
        raise KernelInputError(f"{name} must be [max_pos, {half}] or [max_pos, {head_dim}]")
    t = t[:, :half]
    require_last_dim_contiguous(name, t)
    return t


def apply_rotary_(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """Rotates q [T, Hq, D] and k [T, Hk, D] in place by their token's position.

    Convention (HF Llama "rotate_half", not GPT-J interleaving): dimension i pairs with
    i + D/2; out = x * cos + rotate_half(x) * sin. cos/sin: [max_pos, D/2] with
    cos[p, i] = cos(p * inv_freq[i]); HF's [max_pos, D] tables (the half repeated) are
    accepted too and only their first half is read. positions: int [T].

    Partial rotary (Phi-4-mini): pass the rotary slices `q[..., :R]` and `k[..., :R]`
    (views: the kernel takes the token and head strides) with [max_pos, R/2] tables;
    the dims past R are never read or written.
    """
    if q.dim() != 3 or k.dim() != 3 or q.shape[2] != k.shape[2] or q.shape[0] != k.shape[0]:
        raise KernelInputError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be [T, H, D]")
    head_dim = q.shape[2]
    if head_dim % 2 or positions.shape != (q.shape[0],):
        raise KernelInputError("head_dim must be even and positions must be [T]")
    require_last_dim_contiguous("q", q)
    require_last_dim_contiguous("k", k)
    cos_h, sin_h = _half_table("cos", cos, head_dim), _half_table("sin", sin, head_dim)
    if q.shape[0] == 0:
        return
    half = head_dim // 2
    _rotary_kernel[(q.shape[0],)](
        q,
        k,
        positions,
        cos_h,
        sin_h,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_h.stride(0),
        sin_h.stride(0),
        q.shape[1],
        k.shape[1],
        half,
        BLOCK_QH=next_pow2(q.shape[1]),
        BLOCK_KH=next_pow2(k.shape[1]),
        BLOCK_HALF=next_pow2(half),
    )


def rotary_ref(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """Torch reference: returns x [T, H, D] rotated (HF rotate_half), computed in fp32."""
    half = x.shape[-1] // 2
    c = cos[positions.long(), :half].float().repeat(1, 2).unsqueeze(1)
    s = sin[positions.long(), :half].float().repeat(1, 2).unsqueeze(1)
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * c + rotated * s).to(x.dtype)


def rope_cos_sin(max_pos: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain (unscaled) rope tables in the [max_pos, head_dim/2] layout, fp32 on the CPU."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


# ---------------------------------------------------------------- SiLU and mul


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """[T, 2*I] -> [T, I]: silu(gate) * up with gate = x[:, :I], up = x[:, I:]."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise KernelInputError(f"x must be [T, 2*I], got {tuple(x.shape)}")
    require_last_dim_contiguous("x", x)
    inter = x.shape[1] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    block = min(1024, next_pow2(inter))
    _silu_and_mul_kernel[(x.shape[0], triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), inter, BLOCK=block
    )
    return out


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Torch reference of `silu_and_mul` (fp32 math, one rounding)."""
    inter = x.shape[1] // 2
    xf = x.float()
    return (F.silu(xf[:, :inter]) * xf[:, inter:]).to(x.dtype)
