"""The CPU's attention: the torch reference, with decode rows on a paged numba kernel.

Prefill rows (long queries) stay on SDPA, where its CPU kernel is efficient (with a
soft cap, which SDPA lacks, on the reference's spelt-out math); one-token queries and
short ones (speculative verify rows) go to `engine.attention.cpu_kernels.paged_decode`,
which reads K/V from the block pool directly. Pools or queries in another dtype than float32 (numba has no
bf16) keep the reference path.
"""

from __future__ import annotations

import torch

from engine.attention import cpu_kernels
from engine.attention.backend import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import MAX_SPECULATIVE_TOKENS

# Rows of up to this many new tokens (a decode token, a speculative verify row of k
# drafts + 1, a short prefill tail) run on the kernel, each token as an item that sees
# the keys up to its own position. Beyond, SDPA's blocked kernel over one gathered copy
# of the context is cheaper than re-reading the context once per query token.
KERNEL_MAX_QUERY_LEN = MAX_SPECULATIVE_TOKENS + 1


class CpuAttentionBackend(TorchAttentionBackend):
    """`TorchAttentionBackend` whose decode and short rows run on the paged CPU kernel."""

    name = "cpu"

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor,
        window: int | None,
        softcap: float | None = None,
    ) -> list[int]:
        """Runs every row of up to `KERNEL_MAX_QUERY_LEN` tokens on the kernel, one item
        per query token; other dtypes go to the reference."""
        if not q.dtype == kv_cache.dtype == torch.float32:
            return super()._decode(q, kv_cache, meta, scale, out, window, softcap)
        seqs: list[int] = []
        items: list[int] = []
        query_rows: list[int] = []
        ends: list[int] = []
        start = 0
        for i, n in enumerate(meta.query_lens_cpu):
            if 0 < n <= KERNEL_MAX_QUERY_LEN:
                seqs.append(i)
                first_end = meta.seq_lens_cpu[i] - n + 1
                for r in range(n):
                    items.append(i)
                    query_rows.append(start + r)
                    ends.append(first_end + r)
            start += n
        if items:
            cpu_kernels.paged_decode(
                q.contiguous(),
                kv_cache,
                meta.block_tables,
                items,
                query_rows,
                ends,
                scale,
                out,
                window,
                softcap,
            )
        return seqs
