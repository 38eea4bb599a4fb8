"""Stores a step's new K/V rows into the paged cache through the slot mapping.

    kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot s -> block s // block_size, offset s % block_size; s < 0 is padding (skipped)

One program per new token copies all its KV heads, so the store is one wide,
contiguous write per token (a cache slot holds heads x head_dim contiguously).
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped; the host
# launchers below are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.kernels.common import (
    KernelInputError,
    next_pow2,
    require_last_dim_contiguous,
    require_same_device,
)


@triton.jit
def _kv_write_kernel(
    k_ptr,
    v_ptr,
    cache_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_c_kv,
    stride_c_blk,
    stride_c_tok,
    stride_c_h,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    # slot < 0 marks padding: the mask turns the whole program into a no-op.
    slots = tl.full([BLOCK_H, BLOCK_D], 0, tl.int64) + slot
    mask = (h[:, None] < num_kv_heads) & (d[None, :] < head_dim) & (slots >= 0)
    k = tl.load(k_ptr + tok * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    dst = cache_ptr + blk * stride_c_blk + off * stride_c_tok + h[:, None] * stride_c_h + d[None, :]
    elem = cache_ptr.dtype.element_ty
    tl.store(dst, k.to(elem), mask=mask)
    tl.store(dst + stride_c_kv, v.to(elem), mask=mask)


def kv_write(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Stores k/v ([num_tokens, num_kv_heads, head_dim]) at their flat slots in `kv_cache`.

    Rows whose slot is negative are skipped; values are cast to the cache's dtype.
    """
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise KernelInputError(
            f"kv_cache must be [2, blocks, block_size, heads, dim], got {tuple(kv_cache.shape)}"
        )
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    if k.shape != v.shape or k.dim() != 3 or tuple(k.shape[1:]) != (num_kv_heads, head_dim):
        raise KernelInputError(
            f"k/v shapes {tuple(k.shape)}, {tuple(v.shape)} do not fit the cache"
        )
    if slot_mapping.shape != (k.shape[0],):
        raise KernelInputError("slot_mapping must have one entry per token")
    require_same_device(k, v, kv_cache, slot_mapping)
    for name, t in (("k", k), ("v", v), ("kv_cache", kv_cache)):
        require_last_dim_contiguous(name, t)
    if k.shape[0] == 0:
        return
    _kv_write_kernel[(k.shape[0],)](
        k,
        v,
        kv_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        kv_cache.stride(0),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        num_kv_heads,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=next_pow2(num_kv_heads),
        BLOCK_D=next_pow2(head_dim),
    )
