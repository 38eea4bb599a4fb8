"""The CPU backend (paged numba decode kernel) against a naive oracle and the torch reference."""

from __future__ import annotations

import pytest
import torch

from engine.attention import cpu_kernels
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.select import get_attention_backend
from engine.attention.torch_backend import TorchAttentionBackend
from tests.engine.kernels.batch_factory import PagedBatch, make_batch, reference_output

SCALE = 64**-0.5
TOL = 1e-4


def _run(batch: PagedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU backend's output and the cache it left, on a copy of the batch's cache."""
    cache = batch.kv_cache.clone()
    out = CpuAttentionBackend().forward(batch.q, batch.k, batch.v, cache, batch.meta, SCALE)
    return out, cache


def _check(batch: PagedBatch) -> None:
    expected, expected_cache = reference_output(batch, SCALE)
    out, cache = _run(batch)
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)
    torch.testing.assert_close(cache, expected_cache, atol=0, rtol=0)
    ref_cache = batch.kv_cache.clone()
    ref = TorchAttentionBackend().forward(batch.q, batch.k, batch.v, ref_cache, batch.meta, SCALE)
    torch.testing.assert_close(out, ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 4), (8, 1)])
def test_pure_decode_matches_the_oracle(block_size: int, heads: int, kv_heads: int) -> None:
    # Lengths across block edges, a first token (no context) and a long one.
    spec = [(0, 1), (block_size - 1, 1), (2 * block_size + 3, 1), (300, 1)]
    _check(
        make_batch(spec, block_size=block_size, num_heads=heads, num_kv_heads=kv_heads, head_dim=64)
    )


def test_a_single_decode_row_runs_on_the_kernel() -> None:
    # The reference sends a lone decode row to SDPA; here it is the kernel's too.
    _check(make_batch([(37, 1)], block_size=16, num_heads=9, num_kv_heads=3, head_dim=64))


def test_mixed_prefill_and_decode_rows() -> None:
    # Decode rows sit between prefill chunks (with and without a cached prefix), so the
    # kernel must find each one's token row and leave the prefill rows to SDPA.
    spec = [(20, 5), (40, 1), (0, 7), (17, 1), (0, 1), (33, 12)]
    batch = make_batch(spec, block_size=16, num_heads=9, num_kv_heads=3, head_dim=32, pad_slots=3)
    expected, _ = reference_output(batch, SCALE)
    out, _ = _run(batch)
    real = sum(n for _, n in spec)
    torch.testing.assert_close(out[:real], expected[:real], atol=TOL, rtol=TOL)


def test_verify_rows_run_on_the_kernel_one_item_per_query_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A speculative verify row (k drafts + 1 after a long context) is a short query: each
    of its tokens is a kernel item seeing the keys up to its own position, so it matches
    the oracle's causal answer; a long prefill row stays on SDPA."""
    from engine.attention.cpu_backend import KERNEL_MAX_QUERY_LEN

    items: list[tuple[list[int], list[int], list[int]]] = []
    kernel = cpu_kernels.paged_decode

    def recording(*args: object, **kwargs: object) -> None:
        items.append((list(args[3]), list(args[4]), list(args[5])))  # type: ignore[call-overload]
        kernel(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_kernels, "paged_decode", recording)
    long = KERNEL_MAX_QUERY_LEN + 1
    spec = [(300, 5), (40, 1), (70, KERNEL_MAX_QUERY_LEN), (0, long), (17, 3)]
    batch = make_batch(spec, block_size=16, num_heads=9, num_kv_heads=3, head_dim=64, seed=7)
    expected, _ = reference_output(batch, SCALE)
    out, _ = _run(batch)
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)
    ((seqs, rows, ends),) = items
    assert seqs == [0] * 5 + [1] + [2] * KERNEL_MAX_QUERY_LEN + [4] * 3
    starts = [0, 5, 6, 6 + KERNEL_MAX_QUERY_LEN + long]
    assert rows[:6] == list(range(6))
    assert rows[6 : 6 + KERNEL_MAX_QUERY_LEN] == list(range(6, 6 + KERNEL_MAX_QUERY_LEN))
    assert rows[-3:] == [starts[3] + r for r in range(3)]
    # Causal lengths: the r-th new token of a row sees its context and r + 1 new keys.
    assert ends[:5] == [301, 302, 303, 304, 305]
    assert ends[5] == 41
    assert ends[6 : 6 + KERNEL_MAX_QUERY_LEN] == [71 + r for r in range(KERNEL_MAX_QUERY_LEN)]
    assert ends[-3:] == [18, 19, 20]


def test_a_non_contiguous_query_is_read_correctly() -> None:
    batch = make_batch([(5, 1), (50, 1)], block_size=8, num_heads=4, num_kv_heads=2, head_dim=16)
    wide = torch.randn(batch.q.shape[0], batch.q.shape[1], 2 * batch.q.shape[2])
    wide[..., ::2] = batch.q
    strided = PagedBatch(wide[..., ::2], batch.k, batch.v, batch.kv_cache, batch.meta)
    assert not strided.q.is_contiguous()
    _check(strided)


def test_other_dtypes_keep_the_reference_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # numba has no bfloat16: such a pool must never reach the kernel.
    calls: list[int] = []
    monkeypatch.setattr(cpu_kernels, "paged_decode", lambda *a, **k: calls.append(1))
    batch = make_batch(
        [(10, 1), (30, 1)],
        block_size=16,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.bfloat16,
    )
    expected, _ = reference_output(batch, SCALE)
    out, _ = _run(batch)
    assert calls == []
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


def test_auto_picks_the_cpu_backend_on_the_cpu() -> None:
    assert get_attention_backend("auto", torch.device("cpu")).name == "cpu"
    assert get_attention_backend("torch", torch.device("cpu")).name == "torch"


def test_the_cpu_backend_refuses_another_device_and_a_missing_numba(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError, match="runs on the CPU"):
        get_attention_backend("cpu", torch.device("cuda"))
    monkeypatch.setattr(cpu_kernels, "numba", None)
    with pytest.raises(ValueError, match="needs numba"):
        get_attention_backend("cpu", torch.device("cpu"))
    # Without numba, auto falls back to the reference rather than failing.
    assert get_attention_backend("auto", torch.device("cpu")).name == "torch"


@pytest.mark.parametrize("window", [1, 6, 40])
@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend])
def test_a_sliding_window_matches_the_oracle(window: int, backend: type) -> None:
    """Decode rows (one alone, several batched) and prefill chunks after a prefix, each
    seeing only its last `window` positions."""
    spec = [(20, 5), (40, 1), (0, 17), (63, 1), (33, 12), (5, 1)]
    batch = make_batch(spec, block_size=16, num_heads=6, num_kv_heads=2, head_dim=32, seed=window)
    expected, _ = reference_output(batch, SCALE, window=window)
    out = backend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, SCALE, window
    )
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)
    lone = make_batch([(50, 1)], block_size=8, num_heads=4, num_kv_heads=4, head_dim=32)
    out = backend().forward(lone.q, lone.k, lone.v, lone.kv_cache.clone(), lone.meta, SCALE, window)
    torch.testing.assert_close(
        out, reference_output(lone, SCALE, window=window)[0], atol=TOL, rtol=TOL
    )


@pytest.mark.parametrize(("softcap", "window"), [(1.0, None), (2.0, None), (2.0, 6)])
@pytest.mark.parametrize("backend", [TorchAttentionBackend, CpuAttentionBackend])
def test_a_softcap_matches_the_oracle(softcap: float, window: int | None, backend: type) -> None:
    """Gemma 2's cap on the scaled scores, before the mask: decode rows alone and batched
    (the numba kernel on the CPU backend, SDPA's stand-in on the reference), prefill
    chunks after a prefix, with and without a window. Scores here are of order 1 to 3,
    so a cap of 1 or 2 bends them: ignoring it is far outside the tolerance."""
    spec = [(20, 5), (40, 1), (0, 17), (63, 1), (33, 12), (5, 1)]
    batch = make_batch(spec, block_size=16, num_heads=6, num_kv_heads=2, head_dim=64, seed=3)
    scale = 0.25  # q.k has std 8 at head_dim 64: scaled scores of std 2
    expected, _ = reference_output(batch, scale, window=window, softcap=softcap)
    uncapped, _ = reference_output(batch, scale, window=window)
    cache = batch.kv_cache.clone()
    out = backend().forward(batch.q, batch.k, batch.v, cache, batch.meta, scale, window, softcap)
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)
    assert (out - uncapped).abs().max() > 0.05
    lone = make_batch([(50, 1)], block_size=8, num_heads=4, num_kv_heads=4, head_dim=64)
    out = backend().forward(
        lone.q, lone.k, lone.v, lone.kv_cache.clone(), lone.meta, scale, window, softcap
    )
    torch.testing.assert_close(
        out, reference_output(lone, scale, window, softcap)[0], atol=TOL, rtol=TOL
    )


def test_a_softcap_in_bfloat16_keeps_the_reference_path() -> None:
    # numba has no bf16: the reference's spelt-out capped math serves, within bf16's rounding.
    spec = [(10, 1), (30, 1), (0, 9)]
    batch = make_batch(spec, block_size=16, num_heads=4, num_kv_heads=2, head_dim=64,
                       dtype=torch.bfloat16)  # fmt: skip
    expected, _ = reference_output(batch, 0.25, softcap=1.0)
    out = CpuAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, 0.25, None, 1.0
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    uncapped, _ = reference_output(batch, 0.25)
    assert (out.float() - uncapped).abs().max() > 0.1


def test_the_capped_reference_gives_the_same_answer_in_chunks_of_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Long queries go through the capped math a few rows at a time (bounded scores);
    each chunk takes its own rows of the causal and window mask."""
    from engine.attention import torch_backend

    spec = [(20, 25), (40, 1), (0, 17), (63, 1)]
    batch = make_batch(spec, block_size=16, num_heads=6, num_kv_heads=2, head_dim=32, seed=5)
    expected, _ = reference_output(batch, 0.3, window=9, softcap=1.5)
    monkeypatch.setattr(torch_backend, "_SCORE_ELEMENTS", 6 * 64 * 3)  # 3 to 6 rows a chunk
    out = TorchAttentionBackend().forward(
        batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, 0.3, 9, 1.5
    )
    torch.testing.assert_close(out, expected, atol=TOL, rtol=TOL)
