"""TritonAttentionBackend as a drop-in for the torch reference backend."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.attention.select import get_attention_backend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend
from tests.engine.kernels.batch_factory import (
    DEVICE,
    DTYPES,
    device_batch,
    dtype_id,
    make_batch,
    reference_output,
    tolerance,
)

SCALE = 64**-0.5


def _check(spec: list[tuple[int, int]], rows: int | None = None, **options: Any) -> None:
    """On a batch from `spec` (`options`: device_batch's), the triton backend agrees with
    the naive oracle and with the torch backend."""
    batch = device_batch(spec, **options)
    expected, expected_cache = reference_output(batch, SCALE)
    torch_cache = batch.kv_cache.clone()
    torch_out = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, torch_cache, batch.meta, SCALE
    )
    out = TritonAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache, batch.meta, SCALE
    )
    tol = tolerance(batch.q.dtype)
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    n = rows if rows is not None else out.shape[0]
    torch.testing.assert_close(out[:n].float(), expected[:n], atol=tol, rtol=tol)
    # Drop-in: the same answer as the torch backend, within the dtype's rounding.
    torch.testing.assert_close(out[:n].float(), torch_out[:n].float(), atol=2 * tol, rtol=2 * tol)
    assert torch.equal(batch.kv_cache, torch_cache)
    # The cache holds exactly what the reference wrote (after rounding to its dtype).
    torch.testing.assert_close(batch.kv_cache.float(), expected_cache, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_pure_decode_batch(block_size: int, dtype: torch.dtype) -> None:
    spec = [(0, 1), (block_size - 1, 1), (2 * block_size + 3, 1)]
    _check(spec, block_size=block_size, num_heads=9, num_kv_heads=3, head_dim=64, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_mixed_prefill_and_decode_batch(block_size: int, dtype: torch.dtype) -> None:
    spec = [(0, 13), (30, 1), (block_size + 2, 7), (5, 1)]
    dims = {"num_heads": 8, "num_kv_heads": 1, "head_dim": 128}
    _check(spec, block_size=block_size, dtype=dtype, seed=1, **dims)


def test_padded_decode_batch_ignores_padding_rows() -> None:
    spec = [(4, 1), (17, 1)]
    _check(spec, rows=2, block_size=8, num_heads=4, num_kv_heads=2, head_dim=64, pad_slots=2)


def test_decode_step_with_an_idle_sequence_takes_the_general_path() -> None:
    # max_query_len is 1 but one sequence adds nothing, so q row i is not sequence i.
    _check([(4, 1), (9, 0), (17, 1)], block_size=8, num_heads=4, num_kv_heads=2, head_dim=64)


def test_backend_is_selected_by_name() -> None:
    backend = get_attention_backend("triton", torch.device(DEVICE))
    assert isinstance(backend, TritonAttentionBackend)
    assert backend.name == "triton"


@pytest.mark.parametrize(
    "spec",
    [[(0, 1), (9, 1), (40, 1)], [(0, 13), (30, 1), (18, 7), (5, 1)]],
    ids=["decode", "mixed"],
)
def test_a_softcap_reaches_both_kernels(spec: list[tuple[int, int]]) -> None:
    """The backend hands the layer's cap (and window) to the decode kernel (pure decode)
    and to the prefill kernel (mixed batch): the same answer as the torch backend and the
    oracle, and not the uncapped one."""
    batch = make_batch(spec, block_size=8, num_heads=4, num_kv_heads=2, head_dim=64,
                       device=DEVICE, seed=11)  # fmt: skip
    scale, softcap, window = 0.25, 1.5, 12
    expected, _ = reference_output(batch, scale, window=window, softcap=softcap)
    torch_out = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, scale, window, softcap
    )
    out = TritonAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache, batch.meta, scale, window, softcap
    )
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(out, torch_out, atol=2e-4, rtol=2e-4)
    uncapped, _ = reference_output(batch, scale, window=window)
    assert (out - uncapped).abs().max() > 0.1
