"""Builds an engine's parts from its config: the model's setup, the attention backend,
the KV pool and its manager, the host/disk tiers, LoRA, the runner, the scheduler, the
grammar compiler, speculation and the KV events publisher. `LLMEngine` runs the step
over what `build_engine_parts` returns."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch

from engine.attention.select import get_attention_backend
from engine.config import (
    CacheConfig,
    EngineConfig,
    LoraConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    StructuredConfig,
)
from engine.kv_cache.host_buffer import HostKVBuffer
from engine.kv_cache.host_setup import attach_host_tier
from engine.kv_cache.host_tier import HostTier
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.sizing import KVCapacity
from engine.kv_cache.tier_copier import TierCopier
from engine.kv_cache.tier_cost import LoadCostRule
from engine.kv_events_publisher import KVEventPublisher
from engine.lora.manager import LoraManager
from engine.model.fused import load_fused_ops, resolve_fused_ops
from engine.model.loader import LoadedModel, default_model_path, load_model
from engine.model.quant import resolve_weight_quant
from engine.runner.memory import plan_engine_kv_capacity
from engine.runner.model_runner import ModelRunner
from engine.scheduler.scheduler import Scheduler
from engine.speculative.draft import build_draft_proposer
from engine.speculative.speculator import Speculator
from engine.structured.compiler import GrammarCompiler

log = logging.getLogger("engine")


def build_config(model: str | None = None, **options: Any) -> EngineConfig:
    """Builds the frozen config from flat keyword options (the vLLM-style `LLM(...)` call)."""
    groups: dict[type, dict[str, Any]] = {
        ModelConfig: {},
        CacheConfig: {},
        SchedulerConfig: {},
        StructuredConfig: {},
        LoraConfig: {},
        SpeculativeConfig: {},
    }
    top: dict[str, Any] = {}
    top_fields = {f.name for f in dataclasses.fields(EngineConfig)} - {
        "model",
        "cache",
        "scheduler",
        "structured",
        "lora",
        "speculative",
    }
    for key, value in options.items():
        for cls, bucket in groups.items():
            if key in {f.name for f in dataclasses.fields(cls)}:
                bucket[key] = value
                break
        else:
            if key not in top_fields:
                raise TypeError(f"unknown engine option {key!r}")
            top[key] = value
    if isinstance(groups[ModelConfig].get("dtype"), str):
        groups[ModelConfig]["dtype"] = getattr(torch, groups[ModelConfig]["dtype"])
    return EngineConfig(
        model=ModelConfig(path=model or "", **groups[ModelConfig]),
        cache=CacheConfig(**groups[CacheConfig]),
        scheduler=SchedulerConfig(**groups[SchedulerConfig]),
        structured=StructuredConfig(**groups[StructuredConfig]),
        lora=LoraConfig(**groups[LoraConfig]),
        speculative=SpeculativeConfig(**groups[SpeculativeConfig]),
        **top,
    )


@dataclass(frozen=True)
class EngineParts:
    """What an engine is made of, wired together; `LLMEngine` keeps each as an attribute."""

    loaded: LoadedModel
    # The longest sequence served: the config's cap, at most the model's positions.
    max_model_len: int
    capacity: KVCapacity
    kv: KVCacheManager
    # Compiles on its own threads; shared with an in-process front (AsyncEngine).
    grammars: GrammarCompiler
    lora: LoraManager
    scheduler: Scheduler
    runner: ModelRunner
    # The host tier's copies and its load-or-recompute rule; None: no tier.
    host_kv: HostKVBuffer | None
    tier_cost: LoadCostRule | None
    # Runs the tier's copies, its loads off the step's path; None: no tier.
    tier_io: TierCopier | None
    # Drafts and their verification (None: speculative decoding is off).
    speculator: Speculator | None
    # Publishes the cache's changes (None: no kv_events_endpoint).
    kv_events: KVEventPublisher | None


def build_engine_parts(config: EngineConfig, loaded: LoadedModel | None = None) -> EngineParts:
    """Loads the model (unless `loaded` is given), sets it up and builds what serves it.

    Seeds torch from the config first. On CUDA this profiles the memory for the KV pool
    and captures the decode graphs (unless `enforce_eager`).
    """
    device = torch.device(config.model.device)
    torch.manual_seed(config.seed)
    if loaded is None:
        loaded = load_model(
            config.model.path or None, dtype=config.model.dtype, device=device, progress=False
        )
    # Before the memory profile and graph capture, which must run the same kernels.
    fused = resolve_fused_ops(config.model.fused_ops, device)
    loaded.model.use_fused_ops(load_fused_ops() if fused else None)
    # "auto" reads the model file's storage type (the bundled model when no path).
    setting = config.model.weight_quant
    path = (config.model.path or default_model_path()) if setting == "auto" else ""
    quant, auto = resolve_weight_quant(setting, path, device)
    # A model loaded elsewhere may be quantized already (or a test double with no
    # such method, which stays as it is when no quantization is asked for).
    if quant != "none" or getattr(loaded.model, "weight_quant", "none") != "none":
        loaded.model.quantize_weights(quant)
    if hasattr(loaded.model, "use_cpu_packed_linears"):  # test doubles have none
        loaded.model.use_cpu_packed_linears(config.model.cpu_packed_linears)
    max_model_len = min(
        config.model.max_model_len or loaded.arch.max_position_embeddings,
        loaded.arch.max_position_embeddings,
    )
    backend = get_attention_backend(config.attention_backend, device)
    # On CUDA: profiled against gpu_memory_utilization; elsewhere plan_kv_capacity.
    capacity = plan_engine_kv_capacity(
        loaded.model,
        loaded.arch,
        backend,
        config.cache,
        config.scheduler,
        max_model_len=max_model_len,
        dtype=config.model.dtype,
        device=device,
    )
    log.info(capacity.describe())
    kv = KVCacheManager.from_config(
        config.cache,
        capacity.num_blocks,
        config.model.revision or loaded.revision,
        window=loaded.arch.kv_window,
    )
    eos = loaded.tokenizer.eos_token_ids
    grammars = GrammarCompiler(
        loaded.tokenizer,
        vocab_size=loaded.arch.vocab_size,
        eos_token_ids=sorted(eos),
        config=config.structured,
    )
    lora = LoraManager(config.lora, loaded.arch, dtype=config.model.dtype, device=device)
    scheduler = Scheduler(
        config.scheduler,
        kv,
        eos_token_ids=eos,
        max_model_len=max_model_len,
        adapter_slots=lora.slots,
    )
    runner = ModelRunner(
        loaded.model,
        loaded.arch,
        backend,
        num_blocks=capacity.num_blocks,
        block_size=config.cache.block_size,
        dtype=config.model.dtype,
        device=device,
        eos_token_ids=eos,
        grammars=grammars,
    )
    runner.lora = lora
    grammar_ready = runner.matchers.ready
    # Out of the step: a sequence whose next mask is being filled, or whose blocks a
    # KV tier is still loading.
    scheduler.seq_ready = lambda seq: grammar_ready(seq) and kv.ready(seq)
    tier = attach_host_tier(config.cache, kv, runner.kv_caches, capacity.bytes_per_block)
    tier_io: TierCopier | None = None
    if tier is not None and isinstance(kv.tier, HostTier):
        tier_io = TierCopier(tier.buffer, kv.tier, kv, tier.cost)
    if not config.model.enforce_eager:  # a no-op on the CPU
        runner.capture_decode_graphs(
            config.model.cuda_graph_max_batch or config.scheduler.max_num_seqs, max_model_len
        )
    graphs = runner.graphs.captured_sizes if runner.graphs else ()
    # One line that says which path this engine runs (the GPU check greps it).
    log.info(
        "engine path: device %s, dtype %s, weights %s, attention %s, fused ops %s, cuda graphs %s",
        device,
        str(config.model.dtype).removeprefix("torch."),
        auto.describe() if auto else quant,
        backend.name,
        "on" if fused else "off",
        f"for batch sizes {list(graphs)}" if graphs else "off",
    )
    speculator: Speculator | None = None
    if config.speculative.enabled:
        proposer = (
            build_draft_proposer(
                config, loaded, backend, num_blocks=capacity.num_blocks, device=device
            )
            if config.speculative.speculative_method == "draft"
            else None
        )
        speculator = Speculator(config.speculative, max_model_len, proposer)
    kv_events: KVEventPublisher | None = None
    if config.cache.kv_events_endpoint is not None:
        kv.record_events("GPU" if device.type == "cuda" else "CPU")
        kv_events = KVEventPublisher(
            config.cache.kv_events_endpoint,
            config.cache.kv_events_topic,
            replay_endpoint=config.cache.kv_events_replay_endpoint,
            buffer_steps=config.cache.kv_events_buffer_steps,
        )
    return EngineParts(
        loaded=loaded,
        max_model_len=max_model_len,
        capacity=capacity,
        kv=kv,
        grammars=grammars,
        lora=lora,
        scheduler=scheduler,
        runner=runner,
        host_kv=None if tier is None else tier.buffer,
        tier_cost=None if tier is None else tier.cost,
        tier_io=tier_io,
        speculator=speculator,
        kv_events=kv_events,
    )
