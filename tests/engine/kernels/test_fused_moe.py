"""The triton grouped-GEMM experts against the torch reference that groups by expert."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.common import KernelInputError
from engine.kernels.fused_moe import BLOCK_M, align_by_expert, fused_moe
from engine.model.moe import moe_experts_ref, route
from tests.engine.kernels.batch_factory import DEVICE, DTYPES, dtype_id, tolerance


def _case(
    tokens: int, experts: int, top_k: int, hidden: int, inter: int, *, seed: int, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    gate = torch.randn(experts, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    x, gate, w13, w2 = (t.to(DEVICE, dtype) for t in (x, gate, w13, w2))
    weights, ids = route(x, gate, top_k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "hidden", "inter"),
    [(1, 4, 2, 64, 48), (7, 8, 2, 64, 40), (33, 4, 3, 96, 64), (5, 16, 1, 32, 32)],
)
def test_fused_moe_matches_the_grouped_reference(
    tokens: int, experts: int, top_k: int, hidden: int, inter: int, dtype: torch.dtype
) -> None:
    x, w13, w2, weights, ids = _case(
        tokens, experts, top_k, hidden, inter, seed=tokens, dtype=dtype
    )
    out = fused_moe(x, w13, w2, weights, ids)
    expected = moe_experts_ref(x.float(), w13.float(), w2.float(), weights.float(), ids)
    assert out.shape == (tokens, hidden) and out.dtype == dtype
    tol = tolerance(dtype)
    torch.testing.assert_close(out.float(), expected, atol=tol * 4, rtol=tol * 4)


def test_the_reference_is_the_sum_of_each_tokens_experts() -> None:
    """moe_experts_ref against the definition, token by token (no grouping)."""
    x, w13, w2, weights, ids = _case(6, 4, 2, 32, 24, seed=9, dtype=torch.float32)
    x, w13, w2, weights, ids = (t.cpu() for t in (x, w13, w2, weights, ids))
    got = moe_experts_ref(x, w13, w2, weights, ids)
    for t in range(6):
        want = torch.zeros(32)
        for j in range(2):
            e = int(ids[t, j])
            h = w13[e] @ x[t]
            want += weights[t, j] * (w2[e] @ (torch.nn.functional.silu(h[:24]) * h[24:]))
        torch.testing.assert_close(got[t], want, atol=1e-5, rtol=1e-5)


def test_slots_are_grouped_by_expert_and_padded_to_blocks() -> None:
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]], device=DEVICE)
    slots, block_experts = align_by_expert(ids, num_experts=5)
    assert block_experts.tolist() == [0, 2, 3]  # expert 1 and 4 have no tokens: no block
    assert slots.numel() == 3 * BLOCK_M
    runs = slots.view(3, BLOCK_M).tolist()
    sentinel = ids.numel()
    assert [sorted(s for s in run if s != sentinel) for run in runs] == [[1, 4], [0, 2, 5], [3]]


def test_bad_shapes_are_refused_by_name() -> None:
    x, w13, w2, weights, ids = _case(3, 4, 2, 32, 16, seed=1, dtype=torch.float32)
    with pytest.raises(KernelInputError, match="do not fit"):
        fused_moe(x[:, :16], w13, w2, weights, ids)
    with pytest.raises(KernelInputError, match=r"\[T, k\]"):
        fused_moe(x, w13, w2, weights[:, :1], ids)
