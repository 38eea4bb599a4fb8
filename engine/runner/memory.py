"""KV pool sizing on a GPU from a memory profile (vLLM's `gpu_memory_utilization`).

    total device memory
    |<------------- total x gpu_memory_utilization ------------->|<- headroom ->|
    | non-torch | weights | activation peak |        KV pool      |  (graphs, ...)|
      (CUDA context, measured)   (dummy forward at max_num_batched_tokens)

The engine may use `total x utilization` bytes of the device; the KV pool gets what
is left of them after the CUDA context and other non-torch allocations, the
weights, and the activation peak of the largest step. The peak is measured, not
estimated: one dummy prefill of `max_num_batched_tokens` tokens plus logits for
`max_num_seqs` rows. CUDA graphs are captured after the pool exists; their shared
memory pool (one static output per batch size) comes out of the headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.backend import AttentionBackend, AttentionMetadata
from engine.config import CacheConfig, ModelArchitecture, SchedulerConfig
from engine.kv_cache.sizing import (
    InsufficientMemoryError,
    KVCapacity,
    capacity_from_budget,
    plan_kv_capacity,
)
from engine.model.forward_context import ForwardContext
from engine.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes measured on the device before the KV pool is allocated."""

    total_bytes: int
    weights_bytes: int  # everything torch holds before profiling: the weights
    activation_peak_bytes: int  # peak extra allocation of the dummy step
    non_torch_bytes: int  # CUDA context, cuBLAS workspaces, other processes' share

    def describe(self) -> str:
        """One line for the start-up log."""
        gib = 2**30
        return (
            f"memory: total {self.total_bytes / gib:.2f} GiB, weights "
            f"{self.weights_bytes / gib:.2f} GiB, activation peak "
            f"{self.activation_peak_bytes / gib:.2f} GiB, non-torch "
            f"{self.non_torch_bytes / gib:.2f} GiB"
        )


def kv_cache_budget(profile: MemoryProfile, utilization: float) -> int:
    """Bytes the KV pool may take: total x utilization minus everything else measured."""
    if not 0.0 < utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    allowed = int(profile.total_bytes * utilization)
    used = profile.weights_bytes + profile.activation_peak_bytes + profile.non_torch_bytes
    budget = allowed - used
    if budget <= 0:
        raise InsufficientMemoryError(
            f"no memory left for the KV cache: {allowed} bytes allowed "
            f"({utilization:.0%} of {profile.total_bytes}), {used} already needed "
            f"({profile.describe()}); raise gpu_memory_utilization or lower "
            "max_num_batched_tokens"
        )
    return budget


@dataclass(frozen=True)
class DummyBatch:
    """A flat prefill step of fresh sequences, each owning a contiguous run of blocks."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    num_blocks: int


def dummy_prefill_batch(
    num_tokens: int, max_model_len: int, block_size: int, device: torch.device
) -> DummyBatch:
    """`num_tokens` prompt tokens split into sequences of at most `max_model_len`."""
    lens = [max_model_len] * (num_tokens // max_model_len)
    if num_tokens % max_model_len:
        lens.append(num_tokens % max_model_len)
    blocks = [-(-n // block_size) for n in lens]
    starts: list[int] = [0]
    slots: list[int] = []
    tables: list[list[int]] = []
    first_block = 0
    for n, b in zip(lens, blocks, strict=True):
        starts.append(starts[-1] + n)
        slots.extend(range(first_block * block_size, first_block * block_size + n))
        tables.append(list(range(first_block, first_block + b)) + [0] * (max(blocks) - b))
        first_block += b
    positions = torch.cat([torch.arange(n) for n in lens])
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        max_query_len=max(lens),
        max_seq_len=max(lens),
        query_lens_cpu=tuple(lens),
        seq_lens_cpu=tuple(lens),
    )
    return DummyBatch(
        input_ids=torch.zeros(num_tokens, dtype=torch.int64, device=device),
        positions=positions.to(device),
        meta=meta,
        num_blocks=first_block,
    )


@torch.inference_mode()
def run_dummy_step(
    model: LlamaForCausalLM,
    arch: ModelArchitecture,
    backend: AttentionBackend,
    batch: DummyBatch,
    kv_caches: list[torch.Tensor],
    num_logit_rows: int,
) -> None:
    """The largest step the engine will run: a full token budget, then logits and a sort."""
    ctx = ForwardContext(backend=backend, meta=batch.meta, kv_caches=kv_caches)
    hidden = model(batch.input_ids, batch.positions, ctx)
    rows = hidden[-1:].expand(num_logit_rows, hidden.shape[-1])
    logits = model.compute_logits(rows)
    # The sampler's worst case: probabilities sorted for top-p over the whole vocabulary.
    torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)


def profile_memory(
    model: LlamaForCausalLM,
    arch: ModelArchitecture,
    backend: AttentionBackend,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> MemoryProfile:
    """Measures weights, non-torch memory and the activation peak on a CUDA device."""
    if device.type != "cuda":
        raise ValueError("memory profiling needs a CUDA device")
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    weights = torch.cuda.memory_allocated(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    batch = dummy_prefill_batch(max_num_batched_tokens, max_model_len, block_size, device)
    shape = (2, batch.num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(arch.num_layers)]
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)  # weights + the dummy KV, not counted
    run_dummy_step(model, arch, backend, batch, kv, max(1, max_num_seqs))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    del kv, batch
    torch.cuda.empty_cache()
    return MemoryProfile(
        total_bytes=int(total),
        weights_bytes=int(weights),
        activation_peak_bytes=int(peak),
        non_torch_bytes=int(non_torch),
    )


def plan_engine_kv_capacity(
    model: LlamaForCausalLM,
    arch: ModelArchitecture,
    backend: AttentionBackend,
    cache: CacheConfig,
    scheduler: SchedulerConfig,
    *,
    max_model_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> KVCapacity:
    """The engine's pool: profiled on CUDA unless pinned by num_blocks or kv_cache_bytes.

    Everywhere else (the CPU, or an explicit budget) `plan_kv_capacity` decides.
    """
    max_useful = scheduler.max_num_seqs * max_model_len
    if device.type != "cuda" or cache.num_blocks is not None or cache.kv_cache_bytes is not None:
        return plan_kv_capacity(arch, cache, dtype, device, max_useful_tokens=max_useful)
    profile = profile_memory(
        model,
        arch,
        backend,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        max_num_seqs=scheduler.max_num_seqs,
        max_model_len=max_model_len,
        block_size=cache.block_size,
        dtype=dtype,
        device=device,
    )
    budget = kv_cache_budget(profile, cache.gpu_memory_utilization)
    return capacity_from_budget(budget, arch, cache, dtype, max_useful_tokens=max_useful)
