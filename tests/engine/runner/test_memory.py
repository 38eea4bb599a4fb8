"""KV budget arithmetic (injected numbers) and the profiling step's dummy batch on the CPU."""

from __future__ import annotations

import pytest
import torch

from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import CacheConfig, SchedulerConfig
from engine.kv_cache.sizing import bytes_per_block
from engine.runner.memory import (
    InsufficientMemoryError,
    MemoryProfile,
    capacity_from_budget,
    dummy_prefill_batch,
    kv_cache_budget,
    plan_engine_kv_capacity,
    run_dummy_step,
)
from tests.engine.runner.factory import tiny_arch, tiny_model

GIB = 2**30


def _profile(weights: float, peak: float, non_torch: float, total: float = 141) -> MemoryProfile:
    return MemoryProfile(
        total_bytes=int(total * GIB),
        weights_bytes=int(weights * GIB),
        activation_peak_bytes=int(peak * GIB),
        non_torch_bytes=int(non_torch * GIB),
    )


def test_budget_is_total_times_utilization_minus_everything_measured() -> None:
    # An H200-like device: 141 GiB, 0.9 of it allowed, 16 GiB weights, 2 GiB peak, 1 GiB other.
    budget = kv_cache_budget(_profile(16, 2, 1), 0.9)
    assert budget == int(141 * GIB * 0.9) - 19 * GIB
    assert kv_cache_budget(_profile(16, 2, 1), 1.0) == 122 * GIB


def test_budget_refuses_a_bad_fraction_and_an_empty_remainder() -> None:
    with pytest.raises(ValueError):
        kv_cache_budget(_profile(1, 1, 1), 0.0)
    with pytest.raises(ValueError):
        kv_cache_budget(_profile(1, 1, 1), 1.5)
    with pytest.raises(InsufficientMemoryError, match="gpu_memory_utilization"):
        kv_cache_budget(_profile(60, 10, 1, total=80), 0.5)


def test_capacity_from_budget_counts_whole_blocks_and_caps_at_useful_tokens() -> None:
    arch = tiny_arch()
    cache = CacheConfig(block_size=16)
    per_block = bytes_per_block(arch, 16, torch.bfloat16)
    assert per_block == 2 * arch.num_layers * 16 * arch.num_kv_heads * arch.head_dim * 2
    cap = capacity_from_budget(10 * per_block + per_block // 2, arch, cache, torch.bfloat16)
    assert cap.num_blocks == 10
    assert cap.bytes_per_block == per_block
    capped = capacity_from_budget(
        1000 * per_block, arch, cache, torch.bfloat16, max_useful_tokens=33
    )
    assert capped.num_blocks == 3  # ceil(33 / 16)
    with pytest.raises(InsufficientMemoryError):
        capacity_from_budget(per_block - 1, arch, cache, torch.bfloat16)


def test_plan_engine_kv_capacity_keeps_the_cpu_sizing() -> None:
    arch = tiny_arch()
    cap = plan_engine_kv_capacity(
        tiny_model(arch),
        arch,
        TorchAttentionBackend(),
        CacheConfig(block_size=8, num_blocks=37),
        SchedulerConfig(),
        max_model_len=64,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    assert (cap.num_blocks, cap.block_size) == (37, 8)


@pytest.mark.parametrize(("tokens", "max_len"), [(40, 16), (32, 32), (5, 64)])
def test_dummy_prefill_batch_is_a_valid_step_the_model_runs(tokens: int, max_len: int) -> None:
    batch = dummy_prefill_batch(tokens, max_len, 4, torch.device("cpu"))
    meta = batch.meta
    assert sum(meta.query_lens_cpu) == tokens == batch.input_ids.numel()
    assert max(meta.seq_lens_cpu) <= max_len
    assert meta.query_lens_cpu == meta.seq_lens_cpu  # fresh prompts, no cached prefix
    assert sorted(meta.slot_mapping.tolist()) == meta.slot_mapping.tolist()
    assert len(set(meta.slot_mapping.tolist())) == tokens
    assert batch.num_blocks * 4 >= tokens
    arch = tiny_arch()
    kv = [
        torch.zeros(2, batch.num_blocks, 4, arch.num_kv_heads, arch.head_dim)
        for _ in range(arch.num_layers)
    ]
    run_dummy_step(tiny_model(arch), arch, TorchAttentionBackend(), batch, kv, num_logit_rows=3)
    assert all(bool(layer.abs().sum() > 0) for layer in kv)  # every layer stored its K/V
