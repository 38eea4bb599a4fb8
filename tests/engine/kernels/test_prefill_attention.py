"""Paged varlen prefill attention against the torch reference backend."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engine.attention.torch_backend import write_kv
from engine.kernels.prefill_attention import prefill_attention, prefill_tile_sizes
from tests.engine.kernels.batch_factory import (
    DEVICE,
    MATRIX_DTYPES,
    PagedBatch,
    assert_matches_reference,
    device_batch,
    make_batch,
    reference_output,
    shape_matrix,
    tolerance,
)

SCALE = 0.125


def _run_prefill(batch: PagedBatch, scale: float = SCALE, **options: Any) -> torch.Tensor:
    """Writes the batch's new K/V into its cache, then runs the prefill kernel on it
    (`options`: out, window, softcap)."""
    write_kv(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)
    m = batch.meta
    starts, lens = m.query_start_loc, m.seq_lens
    return prefill_attention(
        batch.q, batch.kv_cache, m.block_tables, starts, lens, scale, m.max_query_len, **options
    )


def _ragged_spec(block_size: int, seed: int) -> list[tuple[int, int]]:
    """A fresh prompt, a chunk after a prefix ending mid-block, a decode row, a random one."""
    rng = random.Random(seed)
    return [
        (0, rng.randint(9, 30)),
        (block_size + 3, rng.randint(2, 12)),
        (rng.randint(1, 40), 1),
        (rng.randint(0, 25), rng.randint(1, 20)),
    ]


@shape_matrix
def test_prefill_matches_reference(
    block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> None:
    assert_matches_reference(
        _run_prefill,
        _ragged_spec(block_size, seed=block_size * 3 + head_dim),
        SCALE,
        block_size=block_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        seed=num_heads + head_dim,
    )


def test_prefill_spanning_several_query_tiles() -> None:
    # 70 new rows after a 21-token prefix: two 64-row tiles, the second mostly empty.
    block_m, _ = prefill_tile_sizes(70, 64)
    assert block_m == 64
    batch = device_batch(
        [(21, 70), (3, 5)], block_size=16, num_heads=2, num_kv_heads=1, head_dim=64
    )
    expected, _ = reference_output(batch, SCALE)
    torch.testing.assert_close(_run_prefill(batch).float(), expected, atol=1e-4, rtol=1e-4)


def test_sequence_with_no_new_tokens_is_skipped() -> None:
    # The middle sequence contributes no rows; its neighbours' rows must stay aligned.
    batch = device_batch(
        [(4, 6), (12, 0), (9, 3)], block_size=8, num_heads=3, num_kv_heads=1, head_dim=64
    )
    expected, _ = reference_output(batch, SCALE)
    torch.testing.assert_close(_run_prefill(batch).float(), expected, atol=1e-4, rtol=1e-4)


def test_padding_rows_after_the_batch_are_left_untouched() -> None:
    spec = [(0, 5), (7, 2)]
    batch = device_batch(spec, block_size=8, num_heads=2, num_kv_heads=2, head_dim=64, pad_slots=3)
    out = torch.full_like(batch.q, 7.0)
    _run_prefill(batch, out=out)
    assert torch.equal(out[7:], torch.full_like(out[7:], 7.0))
    assert not torch.equal(out[:7], torch.full_like(out[:7], 7.0))


def test_prefill_is_causal_within_the_new_tokens() -> None:
    # Changing the last new token's K/V must not change any earlier row's output.
    batch = make_batch(
        [(6, 9)], block_size=8, num_heads=2, num_kv_heads=1, head_dim=64, device=DEVICE
    )
    first = _run_prefill(batch).clone()
    batch.k[-1].add_(5.0)
    batch.v[-1].add_(5.0)
    second = _run_prefill(batch)
    torch.testing.assert_close(second[:-1], first[:-1], atol=0, rtol=0)
    assert not torch.allclose(second[-1], first[-1])


@pytest.mark.parametrize("window", [1, 5, 16, 37])
@pytest.mark.parametrize("block_size", [8, 16])
def test_prefill_with_a_sliding_window_matches_reference(block_size: int, window: int) -> None:
    """Long chunks after long prefixes, so windows start inside tiles and tile rows start
    at different keys (some rows of a key tile see nothing)."""
    spec = [(0, 70), (45, 40), (90, 1), (7, 33)]
    batch = make_batch(spec, block_size=block_size, num_heads=6, num_kv_heads=2, head_dim=64,
                       dtype=torch.float32, device=DEVICE, seed=window)  # fmt: skip
    out = _run_prefill(batch, window=window)
    expected, _ = reference_output(batch, SCALE, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=2e-4)
    full, _ = reference_output(batch, SCALE)
    assert (out - full).abs().max() > 1e-3  # the window really cut keys


@pytest.mark.parametrize(("softcap", "window"), [(1.0, None), (2.0, 16)])
def test_prefill_with_a_softcap_matches_reference(softcap: float, window: int | None) -> None:
    """Gemma 2's cap on the scaled scores, before the causal and window masks (a hidden
    key must stay at -inf, not -softcap): long chunks after prefixes and a decode row.
    At scale 0.25 the scores have std 2, so ignoring the cap fails by far."""
    spec = [(0, 70), (45, 40), (90, 1), (7, 33)]
    for dtype in MATRIX_DTYPES:
        batch = make_batch(spec, block_size=16, num_heads=6, num_kv_heads=2, head_dim=64,
                           dtype=dtype, device=DEVICE, seed=7)  # fmt: skip
        out = _run_prefill(batch, 0.25, window=window, softcap=softcap)
        expected, _ = reference_output(batch, 0.25, window=window, softcap=softcap)
        tol = max(2e-4, tolerance(dtype))
        torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)
        uncapped, _ = reference_output(batch, 0.25, window=window)
        assert (out.float() - uncapped).abs().max() > 0.1
