"""BGMV-style LoRA kernels: per token row, its own adapter's A (shrink), then B (expand).

    x [T, in], slots [T] (int, -1: no adapter), a [S, K, in], b [S, out, R]
    shrink:  u[t] = a[slots[t]] @ x[t]                              u [T, K]
    expand:  y[t, o0:o1] += b[slots[t], o0:o1] @ u[t, j*R:(j+1)*R]   per output slice j

One program per (row, tile): each row gathers its own slot's matrices, so a batch
mixing any adapters and the base is one launch per step of the shrink and one per
slice of the expand. Products accumulate in fp32. Tested against the torch path
under TRITON_INTERPRET=1; not yet wired into the model (no GPU check so far).
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped; the host
# launchers below are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import KernelInputError, next_pow2, require_same_device


@triton.jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    u_ptr,
    slot_ptr,
    stride_xt,
    stride_as,
    stride_ak,
    stride_ut,
    n_in,
    n_k,
    BLOCK_K: tl.constexpr,
    BLOCK_IN: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = ks < n_k
    acc = tl.zeros((BLOCK_K,), dtype=tl.float32)
    if slot >= 0:
        for start in range(0, n_in, BLOCK_IN):
            cols = start + tl.arange(0, BLOCK_IN)
            c_mask = cols < n_in
            x = tl.load(x_ptr + row * stride_xt + cols, mask=c_mask, other=0.0).to(tl.float32)
            a = tl.load(
                a_ptr + slot * stride_as + ks[:, None] * stride_ak + cols[None, :],
                mask=k_mask[:, None] & c_mask[None, :],
                other=0.0,
            ).to(tl.float32)
            acc += tl.sum(a * x[None, :], axis=1)
    tl.store(u_ptr + row * stride_ut + ks, acc.to(u_ptr.dtype.element_ty), mask=k_mask)


@triton.jit
def _expand_kernel(
    u_ptr,
    b_ptr,
    y_ptr,
    slot_ptr,
    stride_ut,
    stride_bs,
    stride_bo,
    stride_yt,
    u_offset,
    out_start,
    n_out,
    rank,
    BLOCK_O: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        os = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
        o_mask = os < n_out
        rs = tl.arange(0, BLOCK_R)
        r_mask = rs < rank
        u = tl.load(u_ptr + row * stride_ut + u_offset + rs, mask=r_mask, other=0.0)
        b = tl.load(
            b_ptr + slot * stride_bs + (out_start + os)[:, None] * stride_bo + rs[None, :],
            mask=o_mask[:, None] & r_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        delta = tl.sum(b * u.to(tl.float32)[None, :], axis=1)
        y_ptrs = y_ptr + row * stride_yt + out_start + os
        y = tl.load(y_ptrs, mask=o_mask, other=0.0).to(tl.float32)
        tl.store(y_ptrs, (y + delta).to(y_ptr.dtype.element_ty), mask=o_mask)


def bgmv_add_(
    y: torch.Tensor,
    x: torch.Tensor,
    slots: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    out_slices: tuple[tuple[int, int], ...],
    rank: int,
) -> torch.Tensor:
    """y += each row's adapter delta (see the module docstring); returns y."""
    require_same_device(y, x, slots, a, b)
    t, n_in = x.shape
    n_k = a.shape[1]
    if y.shape[0] != t or slots.shape != (t,) or a.shape[2] != n_in:
        raise KernelInputError("bgmv: x, y, slots and A disagree on rows or width")
    if n_k != len(out_slices) * rank or b.shape[2] != rank:
        raise KernelInputError("bgmv: A's rows must be one rank-wide block per output slice")
    if not (x.is_contiguous() and y.is_contiguous() and a.is_contiguous() and b.is_contiguous()):
        raise KernelInputError("bgmv: tensors must be contiguous")
    if t == 0:
        return y
    u = torch.empty(t, n_k, dtype=torch.float32, device=x.device)
    block_k = min(64, next_pow2(n_k))
    _shrink_kernel[(t, triton.cdiv(n_k, block_k))](
        x, a, u, slots, x.stride(0), a.stride(0), a.stride(1), u.stride(0), n_in, n_k,
        BLOCK_K=block_k, BLOCK_IN=min(128, next_pow2(n_in)),
    )  # fmt: skip
    for j, (start, end) in enumerate(out_slices):
        n_out = end - start
        block_o = min(128, next_pow2(n_out))
        _expand_kernel[(t, triton.cdiv(n_out, block_o))](
            u, b, y, slots, u.stride(0), b.stride(0), b.stride(1), y.stride(0),
            j * rank, start, n_out, rank, BLOCK_O=block_o, BLOCK_R=next_pow2(rank),
        )  # fmt: skip
    return y
