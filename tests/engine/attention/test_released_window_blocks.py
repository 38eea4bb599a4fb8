"""Every attention path reads nothing before a row's window: the blocks there may have
been given back (KVCacheManager.release_behind_window), their table entries naming a
block whose contents are anyone's, NaN included."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend, write_kv
from engine.kernels.decode_attention import decode_attention
from engine.kernels.prefill_attention import prefill_attention
from tests.engine.kernels.batch_factory import PagedBatch, make_batch, reference_output

SCALE = 32**-0.5
TOL = 1e-4
WINDOW = 6
BLOCK = 4
# Decode rows, prefill chunks after long prefixes, a fresh prompt and a chunk whose
# first row's window starts mid-block.
SPEC = [(30, 1), (41, 1), (25, 9), (0, 13), (18, 5), (37, 1)]


def released(batch: PagedBatch, window: int) -> PagedBatch:
    """`batch` as the engine leaves it after releasing: each sequence's blocks wholly
    before its first row's window point to a spare block full of NaN."""
    m = batch.meta
    tables = m.block_tables.clone()
    used = {int(b) for b in tables.flatten()}
    spare = next(b for b in range(batch.kv_cache.shape[1]) if b not in used)
    cache = batch.kv_cache.clone()
    cache[:, spare] = float("nan")
    poisoned = 0
    for i, (q_len, s_len) in enumerate(zip(m.query_lens_cpu, m.seq_lens_cpu, strict=True)):
        first_seen = s_len - q_len - window + 1  # the first row's earliest key
        n = max(0, first_seen) // BLOCK
        tables[i, :n] = spare
        poisoned += n
    assert poisoned >= 10  # the case really leaves blocks behind
    meta = dataclasses.replace(m, block_tables=tables)
    return dataclasses.replace(batch, kv_cache=cache, meta=meta)


def run_backend(backend: type) -> Callable[[PagedBatch], torch.Tensor]:
    def run(batch: PagedBatch) -> torch.Tensor:
        cache = batch.kv_cache.clone()
        return backend().forward(batch.q, batch.k, batch.v, cache, batch.meta, SCALE, WINDOW)

    return run


def run_kernels(batch: PagedBatch) -> torch.Tensor:
    """The triton decode kernel on the one-token rows, the prefill kernel on the rest
    (as the triton backend splits a step)."""
    cache = batch.kv_cache.clone()
    m = batch.meta
    write_kv(batch.k, batch.v, cache, m.slot_mapping)
    prefill = prefill_attention(
        batch.q, cache, m.block_tables, m.query_start_loc, m.seq_lens, SCALE,
        m.max_query_len, window=WINDOW,
    )  # fmt: skip
    decode_rows = [i for i, n in enumerate(m.query_lens_cpu) if n == 1]
    starts = m.query_start_loc.tolist()
    rows = torch.tensor([starts[i] for i in decode_rows])
    picked = torch.tensor(decode_rows)
    decode = decode_attention(
        batch.q.index_select(0, rows), cache, m.block_tables.index_select(0, picked),
        m.seq_lens.index_select(0, picked), SCALE, m.max_seq_len, window=WINDOW,
    )  # fmt: skip
    out = prefill.clone()
    out.index_copy_(0, rows, decode)
    return out


@pytest.mark.parametrize(
    "run",
    [run_backend(TorchAttentionBackend), run_backend(CpuAttentionBackend), run_kernels],
    ids=["torch", "cpu", "triton"],
)
def test_released_blocks_are_never_read(run: Callable[[PagedBatch], torch.Tensor]) -> None:
    batch = make_batch(SPEC, block_size=BLOCK, num_heads=4, num_kv_heads=2, head_dim=32, seed=3)
    expected, _ = reference_output(batch, SCALE, window=WINDOW)
    out = run(released(batch, WINDOW))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)


def test_the_poison_would_show_if_read() -> None:
    """The check above can fail: without the window, the same tables give NaN."""
    batch = released(
        make_batch(SPEC, block_size=BLOCK, num_heads=4, num_kv_heads=2, head_dim=32, seed=3),
        WINDOW,
    )
    out = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, SCALE
    )
    assert not torch.isfinite(out).all()
