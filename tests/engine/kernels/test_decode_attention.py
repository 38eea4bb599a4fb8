"""Paged decode attention (single and split-K) against the torch reference backend."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engine.attention.torch_backend import write_kv
from engine.kernels.common import KernelInputError
from engine.kernels.decode_attention import PARTITION, choose_num_splits, decode_attention
from tests.engine.kernels.batch_factory import (
    DEVICE,
    DTYPES,
    PagedBatch,
    assert_matches_reference,
    make_batch,
    reference_output,
    shape_matrix,
    tolerance,
)

SCALE = 0.125


def _decode_spec(block_size: int, seed: int) -> list[tuple[int, int]]:
    """Context lengths covering: first token, an exactly full block run, mid-block ends."""
    rng = random.Random(seed)
    ends = [1, 2 * block_size, 3 * block_size + 5, rng.randint(2, 90)]
    return [(n - 1, 1) for n in ends]


def _run_decode(batch: PagedBatch, scale: float = SCALE, **options: Any) -> torch.Tensor:
    """Writes the batch's new K/V into its cache, then runs the decode kernel on it
    (`options`: num_splits, window, softcap)."""
    write_kv(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)
    m = batch.meta
    return decode_attention(
        batch.q, batch.kv_cache, m.block_tables, m.seq_lens, scale, m.max_seq_len, **options
    )


@shape_matrix
def test_decode_matches_reference(
    block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    assert_matches_reference(
        _run_decode,
        _decode_spec(block_size, seed=block_size + head_dim),
        SCALE,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=num_heads * 7 + head_dim,
    )


@pytest.mark.parametrize("num_splits", [2, 3, 7])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(6, 2), (8, 1)], ids=["gqa3", "gqa8"])
def test_split_k_matches_reference(num_splits: int, num_heads: int, num_kv_heads: int) -> None:
    # Short sequences next to a long one leave trailing splits empty; they must weigh 0.
    spec = [(150, 1), (0, 1), (40, 1), (97, 1)]
    for dtype in DTYPES:
        batch = make_batch(
            spec,
            block_size=16,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=64,
            dtype=dtype,
            device=DEVICE,
            seed=num_splits,
        )
        expected, _ = reference_output(batch, SCALE)
        got = _run_decode(batch, num_splits=num_splits)
        tol = tolerance(dtype)
        torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def test_automatic_split_on_a_long_context_matches_reference() -> None:
    # One sequence x one KV head is a thin grid, so a context over PARTITION is split.
    seq_len = PARTITION + 77
    assert choose_num_splits(seq_len, num_programs=1, sm_count=1) == 2
    batch = make_batch(
        [(seq_len - 1, 1)], block_size=32, num_heads=2, num_kv_heads=1, head_dim=64, device=DEVICE
    )
    expected, _ = reference_output(batch, SCALE)
    torch.testing.assert_close(_run_decode(batch).float(), expected, atol=1e-4, rtol=1e-4)


def test_choose_num_splits_policy() -> None:
    # Short contexts never split; a thin grid over a long context does; a full grid never.
    assert choose_num_splits(PARTITION, num_programs=1, sm_count=132) == 1
    assert choose_num_splits(8192, num_programs=8, sm_count=132) == 16
    assert choose_num_splits(8192, num_programs=1, sm_count=132) == 16  # capped by length
    assert choose_num_splits(10**6, num_programs=1, sm_count=132) == 32  # capped by MAX_SPLITS
    assert choose_num_splits(8192, num_programs=2048, sm_count=132) == 1


def test_zero_length_sequence_yields_zeros_not_nan() -> None:
    batch = make_batch(
        [(5, 1), (9, 1)], block_size=8, num_heads=2, num_kv_heads=1, head_dim=64, device=DEVICE
    )
    write_kv(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)
    seq_lens = batch.meta.seq_lens.clone()
    seq_lens[1] = 0  # a padded batch row
    for splits in (1, 2):
        out = decode_attention(
            batch.q, batch.kv_cache, batch.meta.block_tables, seq_lens, SCALE, 10, num_splits=splits
        )
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert torch.isfinite(out).all()


def test_decode_rejects_head_count_not_divisible_by_kv_heads() -> None:
    cache = torch.zeros(2, 2, 8, 2, 64, device=DEVICE)
    q = torch.zeros(1, 3, 64, device=DEVICE)
    tables = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(KernelInputError):
        decode_attention(q, cache, tables, lens, SCALE, 1)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("window", [1, 7, 64, 300])
def test_decode_with_a_sliding_window_matches_reference(num_splits: int, window: int) -> None:
    """Windows shorter and longer than a split's part, so some splits lie wholly before
    the window's start and do no work."""
    spec = [(n - 1, 1) for n in (1, 9, 100, 257)]
    batch = make_batch(spec, block_size=16, num_heads=8, num_kv_heads=2, head_dim=64,
                       dtype=torch.float32, device=DEVICE, seed=window)  # fmt: skip
    out = _run_decode(batch, num_splits=num_splits, window=window)
    expected, _ = reference_output(batch, SCALE, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(("softcap", "window"), [(1.0, None), (2.0, 40)])
def test_decode_with_a_softcap_matches_reference(
    num_splits: int, softcap: float, window: int | None
) -> None:
    """Gemma 2's cap on the scaled scores, on one split and several (their partial sums
    merge the capped scores), with and without a window; padding keys past a split's end
    must stay hidden, not become -softcap. At scale 0.25 the scores have std 2, so the cap
    bends them and ignoring it fails by far."""
    spec = [(n - 1, 1) for n in (1, 9, 100, 257)]
    for dtype in DTYPES:
        batch = make_batch(spec, block_size=16, num_heads=8, num_kv_heads=2, head_dim=64,
                           dtype=dtype, device=DEVICE, seed=num_splits)  # fmt: skip
        out = _run_decode(batch, 0.25, num_splits=num_splits, window=window, softcap=softcap)
        expected, _ = reference_output(batch, 0.25, window=window, softcap=softcap)
        tol = max(2e-4, tolerance(dtype))
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
        uncapped, _ = reference_output(batch, 0.25, window=window)
        assert (out.float() - uncapped).abs().max() > 0.1


def test_decode_refuses_a_non_positive_softcap() -> None:
    batch = make_batch([(3, 1)], block_size=8, num_heads=2, num_kv_heads=1, head_dim=64,
                       device=DEVICE)  # fmt: skip
    m = batch.meta
    with pytest.raises(KernelInputError, match="softcap"):
        decode_attention(batch.q, batch.kv_cache, m.block_tables, m.seq_lens, SCALE, 4,
                         softcap=0.0)  # fmt: skip
