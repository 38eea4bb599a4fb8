"""How many KV blocks fit in the memory budget, from the model's real layer and head sizes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import CacheConfig, ModelArchitecture
from engine.errors import EngineError


class InsufficientMemoryError(EngineError):
    """The memory budget (after weights and activations, on a GPU) holds no KV block."""


@dataclass(frozen=True)
class KVCapacity:
    """The pool's size, as reported at start-up."""

    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def num_tokens(self) -> int:
        """Tokens the whole pool holds."""
        return self.num_blocks * self.block_size

    @property
    def total_bytes(self) -> int:
        """Bytes of all K and V tensors."""
        return self.num_blocks * self.bytes_per_block

    def describe(self) -> str:
        """One line for the start-up log."""
        return (
            f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens = "
            f"{self.num_tokens} tokens ({self.total_bytes / 2**20:.1f} MiB)"
        )


def bytes_per_block(arch: ModelArchitecture, block_size: int, dtype: torch.dtype) -> int:
    """K and V of `block_size` tokens over every layer."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * arch.num_layers * block_size * arch.num_kv_heads * arch.head_dim * elem


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA) or available host memory (CPU)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def plan_kv_capacity(
    arch: ModelArchitecture,
    cache: CacheConfig,
    dtype: torch.dtype,
    device: torch.device,
    *,
    max_useful_tokens: int | None = None,
) -> KVCapacity:
    """Sizes the pool: an explicit block count, else a byte budget, else a memory fraction.

    A pool sized from a memory fraction is capped at `max_useful_tokens` (every running
    sequence at full context, plus room for the prefix cache): more would only hold memory.
    """
    if cache.num_blocks is not None:
        per_block = bytes_per_block(arch, cache.block_size, dtype)
        return KVCapacity(cache.num_blocks, cache.block_size, per_block)
    if cache.kv_cache_bytes is not None:
        return capacity_from_budget(cache.kv_cache_bytes, arch, cache, dtype)
    budget = int(available_memory_bytes(device) * cache.memory_fraction)
    return capacity_from_budget(budget, arch, cache, dtype, max_useful_tokens=max_useful_tokens)


def capacity_from_budget(
    budget_bytes: int,
    arch: ModelArchitecture,
    cache: CacheConfig,
    dtype: torch.dtype,
    *,
    max_useful_tokens: int | None = None,
) -> KVCapacity:
    """Blocks that fit `budget_bytes`, capped at what the running sequences can ever use."""
    per_block = bytes_per_block(arch, cache.block_size, dtype)
    num_blocks = budget_bytes // per_block
    if max_useful_tokens is not None:
        num_blocks = min(num_blocks, -(-max_useful_tokens // cache.block_size))
    if num_blocks < 1:
        raise InsufficientMemoryError(f"a {budget_bytes}-byte KV budget holds no block")
    return KVCapacity(num_blocks=num_blocks, block_size=cache.block_size, bytes_per_block=per_block)
