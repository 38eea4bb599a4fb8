"""The CPU's attention: the torch reference, with decode rows on a paged numba kernel.

Prefill rows (long queries) stay on SDPA, where its CPU kernel is efficient (with a
soft cap, which SDPA lacks, on the reference's spelt-out math); one-token
queries go to `engine.attention.cpu_kernels.paged_decode`, which reads K/V from the
block pool directly. Pools or queries in another dtype than float32 (numba has no
bf16) keep the reference path.
"""

from __future__ import annotations

import torch

from engine.attention import cpu_kernels
from engine.attention.backend import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend, token_rows


class CpuAttentionBackend(TorchAttentionBackend):
    """`TorchAttentionBackend` whose decode rows run on the paged CPU kernel."""

    name = "cpu"

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        rows: list[int],
        out: torch.Tensor,
        window: int | None,
        softcap: float | None = None,
    ) -> bool:
        """Runs every one-token row on the kernel; other dtypes go to the reference."""
        if not rows or not q.dtype == kv_cache.dtype == torch.float32:
            return super()._decode(q, kv_cache, meta, scale, rows, out, window, softcap)
        cpu_kernels.paged_decode(
            q.contiguous(),
            kv_cache,
            meta.block_tables,
            meta.seq_lens,
            rows,
            token_rows(meta, rows),
            scale,
            out,
            window,
            softcap,
        )
        return True
