"""The experts of a mixture-of-experts layer as two grouped GEMMs (CUDA; tested on the
CPU under TRITON_INTERPRET=1 against engine.model.moe.moe_experts_ref).

Each token's k routed (token, expert) pairs are "slots" s = t * k + j. The slots are
sorted by expert and each expert's run padded to a multiple of BLOCK_M, so a program
works on BLOCK_M slots of one expert:

    h   [T*k, 2I] = x[token(s)] @ w13[e].T           (grouped GEMM 1)
    act [T*k, I]  = silu(h[:, :I]) * h[:, I:]
    y   [T*k, H]  = w(s) * (act[s] @ w2[e].T)         (grouped GEMM 2, weighted)
    out [T, H]    = sum over j of y[t * k + j]

Products accumulate in fp32 (exact fp32 dots for fp32 inputs).
"""

# Triton kernels take untyped pointer arguments and triton.jit is untyped; the host
# launchers below are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from engine.kernels.common import KernelInputError, dot_precision, require_same_device

BLOCK_M = 16
BLOCK_N = 32
BLOCK_K = 32


@triton.jit
def _grouped_gemm_kernel(
    a_ptr,
    w_ptr,
    c_ptr,
    sorted_ptr,
    expert_ptr,
    weight_ptr,
    n_slots,
    n_out,
    n_in,
    stride_am,
    stride_we,
    stride_wn,
    stride_cm,
    TOP_K: tl.constexpr,
    A_PER_SLOT: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slots = tl.load(sorted_ptr + offs_m).to(tl.int64)
    valid = slots < n_slots
    rows = slots if A_PER_SLOT else slots // TOP_K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_out
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, n_in, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_mask = ks < n_in
        a = tl.load(
            a_ptr + rows[:, None] * stride_am + ks[None, :],
            mask=valid[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            w_ptr + expert * stride_we + cols[None, :] * stride_wn + ks[:, None],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        acc += tl.dot(a, b, input_precision=PRECISION)
    if MUL_WEIGHT:
        w = tl.load(weight_ptr + slots, mask=valid, other=0.0).to(tl.float32)
        acc = acc * w[:, None]
    tl.store(
        c_ptr + slots[:, None] * stride_cm + cols[None, :],
        acc.to(c_ptr.dtype.element_ty),
        mask=valid[:, None] & col_mask[None, :],
    )


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots sorted by expert, each expert's run padded to `block_m` with the sentinel
    T*k; the expert of each block of `block_m`)."""
    flat = topk_ids.reshape(-1)
    n_slots = flat.numel()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    pieces: list[torch.Tensor] = []
    experts: list[int] = []
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        padded = -(-count // block_m) * block_m
        run = torch.full((padded,), n_slots, dtype=torch.int32, device=flat.device)
        run[:count] = order[start : start + count]
        pieces.append(run)
        experts += [expert] * (padded // block_m)
        start += count
    return torch.cat(pieces), torch.tensor(experts, dtype=torch.int32, device=flat.device)


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    sorted_slots: torch.Tensor,
    block_experts: torch.Tensor,
    *,
    top_k: int,
    n_slots: int,
    a_per_slot: bool,
    weights: torch.Tensor | None,
) -> torch.Tensor:
    """c [n_slots, N] = a[row(s)] @ w[e(s)].T (times the slot's weight when given)."""
    n_out, n_in = w.shape[1], w.shape[2]
    c = torch.empty((n_slots, n_out), dtype=a.dtype, device=a.device)
    grid = (block_experts.numel(), triton.cdiv(n_out, BLOCK_N))
    _grouped_gemm_kernel[grid](
        a,
        w,
        c,
        sorted_slots,
        block_experts,
        weights if weights is not None else c,
        n_slots,
        n_out,
        n_in,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        c.stride(0),
        TOP_K=top_k,
        A_PER_SLOT=a_per_slot,
        MUL_WEIGHT=weights is not None,
        PRECISION=dot_precision(a.dtype),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K,
    )
    return c


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/ids [T, k] -> [T, H]."""
    require_same_device(x, w13, w2, topk_weights, topk_ids)
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise KernelInputError("x must be [T, H], w13 [E, 2I, H] and w2 [E, H, I]")
    t, hidden = x.shape
    experts, inter = w2.shape[0], w2.shape[2]
    if w13.shape != (experts, 2 * inter, hidden) or w2.shape[1] != hidden:
        raise KernelInputError(
            f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit x {tuple(x.shape)}"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        raise KernelInputError("topk_weights and topk_ids must both be [T, k]")
    if t == 0:
        return torch.zeros_like(x)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    top_k = topk_ids.shape[1]
    n_slots = t * top_k
    sorted_slots, block_experts = align_by_expert(topk_ids, experts)
    h = _grouped_gemm(
        x,
        w13,
        sorted_slots,
        block_experts,
        top_k=top_k,
        n_slots=n_slots,
        a_per_slot=False,
        weights=None,
    )
    act = (F.silu(h[:, :inter].float()) * h[:, inter:].float()).to(x.dtype).contiguous()
    y = _grouped_gemm(
        act,
        w2,
        sorted_slots,
        block_experts,
        top_k=top_k,
        n_slots=n_slots,
        a_per_slot=True,
        weights=topk_weights.reshape(-1).contiguous(),
    )
    return y.view(t, top_k, hidden).sum(dim=1)
