"""The KV write kernel against the torch reference `write_kv`."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import write_kv
from engine.kernels.common import KernelInputError
from engine.kernels.kv_write import kv_write
from tests.engine.kernels.batch_factory import DEVICE


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(1, 64), (3, 64), (2, 128)])
def test_kv_write_matches_reference(block_size: int, num_kv_heads: int, head_dim: int) -> None:
    gen = torch.Generator().manual_seed(block_size * 31 + num_kv_heads)
    num_blocks = 6
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:9]
    slots[[2, 7]] = -1  # padding rows must leave the cache alone
    k = torch.randn(9, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(9, num_kv_heads, head_dim, generator=gen)
    expected = cache.clone()
    write_kv(k, v, expected, slots)
    got = cache.to(DEVICE)
    kv_write(k.to(DEVICE), v.to(DEVICE), got, slots.to(DEVICE))
    # write_kv skips the padding rows, so equality also proves the kernel did.
    assert torch.equal(got.cpu(), expected)


def test_kv_write_reads_strided_views_and_casts_to_cache_dtype() -> None:
    gen = torch.Generator().manual_seed(3)
    # k and v as column slices of one fused qkv projection: row stride != heads * dim.
    qkv = torch.randn(5, 4 * 64 + 2 * 2 * 64, generator=gen).to(DEVICE)
    k = qkv[:, 256:384].view(5, 2, 64)
    v = qkv[:, 384:].view(5, 2, 64)
    assert not k.is_contiguous()
    cache = torch.zeros(2, 3, 8, 2, 64, dtype=torch.float16, device=DEVICE)
    expected = cache.clone()
    slots = torch.tensor([0, 5, 8, 23, 12], device=DEVICE)
    kv_write(k, v, cache, slots)
    write_kv(k, v, expected, slots)
    assert torch.equal(cache, expected)
    assert cache.dtype == torch.float16


def test_kv_write_all_padding_changes_nothing() -> None:
    cache = torch.randn(2, 2, 8, 1, 64, device=DEVICE)
    before = cache.clone()
    k = torch.randn(3, 1, 64, device=DEVICE)
    kv_write(k, k, cache, torch.full((3,), -1, dtype=torch.int64, device=DEVICE))
    assert torch.equal(cache, before)


def test_kv_write_rejects_mismatched_shapes() -> None:
    cache = torch.zeros(2, 2, 8, 2, 64, device=DEVICE)
    k = torch.zeros(3, 1, 64, device=DEVICE)
    with pytest.raises(KernelInputError):
        kv_write(k, k, cache, torch.zeros(3, dtype=torch.int64, device=DEVICE))
