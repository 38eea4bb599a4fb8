"""Paged decode attention for the CPU, compiled by numba: reads K/V where they lie.

Why: the torch reference gathers every decoding sequence's blocks into a padded copy,
builds a float mask and calls SDPA, whose CPU kernel is tuned for long queries. At
one query per sequence that spent ~25 GFLOP/s and half of a decode step on the small
models this project serves on CPUs (SmolLM2, batch 8, ~270 tokens of context: gather
+ SDPA ~450 us a layer, this kernel ~210 us on 2 cores). The kernel walks each
sequence's block table itself, so nothing is copied and no mask is built.

One task per (query token, KV head): scores of the head's query group against every
cached key, a softmax, then the weighted sum of the values. It runs in parallel over
the tasks on numba's threads and releases the GIL, so an event loop in the same
process keeps running meanwhile.

numba has no bfloat16, so only float32 pools and queries come here (the CPU's default
dtype); `available()` says whether numba imports at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import torch

log = logging.getLogger("engine.attention.cpu")


def _import_numba() -> Any:
    try:
        import numba
    except ImportError:  # the torch reference serves instead
        return None
    return numba


numba: Any = _import_numba()

# The kernel's loop over tasks: numba's parallel range once compiled, a plain one else.
prange = numba.prange if numba is not None else range


def available() -> bool:
    """Whether numba is installed (the kernel compiles on first use)."""
    return numba is not None


def paged_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seqs: list[int],
    rows: list[int],
    ends: list[int],
    scale: float,
    out: torch.Tensor,
    window: int | None = None,
    softcap: float | None = None,
) -> None:
    """Writes out[rows[n]] = attention of q[rows[n]] over the first ends[n] cached keys
    of sequence seqs[n] (the last `window` of them with a sliding window; with
    `softcap`, each scaled score s becomes softcap * tanh(s / softcap) before the
    softmax).

    A decode token sees its whole sequence (ends[n] = its length); the tokens of a
    short multi-token query (a speculative verify row) are items of their own, each
    seeing the keys up to its own position, so causality is in `ends` alone.

    q and out: float32 [num_tokens, num_heads, head_dim]; kv_cache: float32 [2,
    num_blocks, block_size, num_kv_heads, head_dim]; block_tables int32 [num_seqs,
    max_blocks] (every key up to each ends[n] already written). GQA: query head h reads
    KV head h // (num_heads // num_kv_heads).
    """
    assert numba is not None, "paged_decode needs numba (see available())"
    # numba's pool would otherwise use every core, beside torch's own threads.
    numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
    _compiled()(
        q.numpy(),
        kv_cache.numpy(),
        block_tables.numpy(),
        np.asarray(seqs, dtype=np.int64),
        np.asarray(rows, dtype=np.int64),
        np.asarray(ends, dtype=np.int64),
        np.float32(scale),
        out.numpy(),
        np.int64(window or 0),
        np.float32(softcap or 0.0),
    )


@cache
def _compiled() -> Callable[..., None]:
    """The kernel compiled, cached on disk next to this file where that is writable."""
    assert numba is not None
    try:
        kernel: Callable[..., None] = numba.njit(
            _decode_kernel, parallel=True, fastmath=True, nogil=True, cache=True
        )
        return kernel
    except RuntimeError:  # no writable cache location (a read-only image)
        log.info("numba cannot cache the decode attention kernel here; compiling it in memory")
        in_memory: Callable[..., None] = numba.njit(
            _decode_kernel, parallel=True, fastmath=True, nogil=True
        )
        return in_memory


def _decode_kernel(
    q: np.ndarray,
    cache: np.ndarray,
    tables: np.ndarray,
    seqs: np.ndarray,
    rows: np.ndarray,
    ends: np.ndarray,
    scale: np.float32,
    out: np.ndarray,
    window: np.int64,
    softcap: np.float32,
) -> None:
    """The kernel's source (numba compiles it; see `paged_decode` for the arguments;
    `window` 0: no sliding window; `softcap` 0: no cap)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = cache.shape[2], cache.shape[3]
    group = num_heads // num_kv_heads
    for task in prange(seqs.shape[0] * num_kv_heads):
        item = task // num_kv_heads
        seq, row, end = seqs[item], rows[item], ends[item]
        kv_head = task % num_kv_heads
        start = max(0, end - window) if window > 0 else 0
        length = end - start  # the keys this token sees, from `start` on
        first = kv_head * group
        scores = np.empty((group, length), dtype=np.float32)
        for t in range(length):
            pos = start + t
            block, offset = tables[seq, pos // block_size], pos % block_size
            for h in range(group):
                dot = np.float32(0.0)
                for d in range(head_dim):
                    dot += q[row, first + h, d] * cache[0, block, offset, kv_head, d]
                score = dot * scale
                if softcap > 0:  # Gemma 2: bounded to (-softcap, softcap)
                    score = softcap * np.tanh(score / softcap)
                scores[h, t] = score
        # Softmax per query head; the weights are left normalized in `scores`.
        for h in range(group):
            top = scores[h, 0]
            for t in range(1, length):
                top = max(top, scores[h, t])
            total = np.float32(0.0)
            for t in range(length):
                e = np.exp(scores[h, t] - top)
                scores[h, t] = e
                total += e
            inv = np.float32(1.0) / total
            for t in range(length):
                scores[h, t] *= inv
        # One pass over the values serves the whole query group.
        acc = np.zeros((group, head_dim), dtype=np.float32)
        for t in range(length):
            pos = start + t
            block, offset = tables[seq, pos // block_size], pos % block_size
            for h in range(group):
                p = scores[h, t]
                for d in range(head_dim):
                    acc[h, d] += p * cache[1, block, offset, kv_head, d]
        for h in range(group):
            for d in range(head_dim):
                out[row, first + h, d] = acc[h, d]
