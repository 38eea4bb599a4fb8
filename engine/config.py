"""Frozen engine configuration: one dataclass per concern, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from engine.errors import UnsupportedModelError

AttentionBackendName = Literal["torch", "cpu", "triton", "auto"]
PrefixCacheMode = Literal["hash", "radix", "off"]
SchedulingPolicy = Literal["fcfs", "lpm", "fair", "fair_lpm"]
# The fused triton kernels in the model (engine/model/fused.py): auto = on CUDA with triton.
FusedOpsMode = Literal["auto", "on", "off"]
# How next tokens are proposed for one-pass verification (engine/speculative/); "off": none.
SpeculativeMethod = Literal["off", "ngram", "draft"]
SPECULATIVE_METHODS: tuple[str, ...] = ("off", "ngram", "draft")
# Draft tokens one verify row may carry at most (a bound on hostile settings: the verify
# pass's rows grow with it, and acceptance of a long draft falls off geometrically).
MAX_SPECULATIVE_TOKENS = 16


# The largest value of each shape field that a model may declare: well past every
# released checkpoint, and far below what would exhaust memory on allocation.
_SHAPE_BOUNDS: dict[str, int] = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_layers": 1 << 10,
    "num_heads": 1 << 10,
    "num_kv_heads": 1 << 10,
    "head_dim": 1 << 10,
    "max_position_embeddings": 1 << 24,
}


@dataclass(frozen=True)
class ModelArchitecture:
    """Shape of a Llama-family decoder, read from the model's own metadata."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # HF-style rope scaling dict ({"rope_type": "llama3", "factor": ..., ...}) or None;
    # also partial rotary ("partial_rotary_factor") and LongRoPE's per-pair factor lists
    # (tuples), read and bounded by engine/model/rope.py.
    rope_scaling: tuple[tuple[str, float | str | tuple[float, ...]], ...] | None = None
    attention_bias: bool = False  # biases on q, k and v
    architecture: str = "llama"  # the family's name (engine.model.registry)
    output_bias: bool = False  # a bias on o_proj (Llama's attention_bias covers it)
    qk_norm: bool = False  # per-head RMSNorm on q and k before rotary (Qwen3)
    # Each token of a window layer attends to at most this many positions (its own
    # included; Mistral v0.1, Gemma 3's local layers); None: no layer has a window.
    sliding_window: int | None = None
    full_attention_layers: tuple[int, ...] = ()  # the layers without it, in a window model
    # Mixture of experts (engine/model/moe.py); num_experts 0: every layer is dense.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_renormalize: bool = True  # top-k weights rescaled to sum to 1 (Mixtral: always)
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model with a dense MLP
    # Gemma's parts (engine/model/families/gemma3.py).
    mlp_activation: Literal["silu", "gelu_tanh"] = "silu"
    sandwich_norms: bool = False  # norms after attention and around the MLP too
    embedding_multiplier: float = 1.0  # the embeddings are scaled by this
    attention_scale: float | None = None  # None: head_dim ** -0.5
    local_rope_theta: float | None = None  # rotary base of the window layers; None: rope_theta
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    # Gemma 2: every layer's attention scores (q.k * scale) become cap * tanh(s / cap)
    # before the mask and the softmax; None: no cap.
    attention_softcap: float | None = None

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer`'s feed-forward is the sparse one."""
        return self.num_experts > 0 and layer not in self.dense_layers

    def __post_init__(self) -> None:
        """Refuses shapes no checkpoint has (a hostile or corrupt config), by field,
        before anything is allocated for them."""
        for name, most in _SHAPE_BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise UnsupportedModelError(
                    f"{name} must be an integer in [1, {most}], not {value!r}"
                )
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim must be even for rotary, not {self.head_dim}")
        # Rotary's own fields (partial rotary width, LongRoPE's factor lists); imported
        # here because the model package imports this module.
        from engine.model.rope import check_rope_scaling

        check_rope_scaling(self.head_dim, dict(self.rope_scaling or ()))
        cap = self.attention_softcap
        # 0 would divide by zero and a negative cap reverse the scores' order; NaN and
        # inf are no caps at all (released models use 50).
        if cap is not None and (
            isinstance(cap, bool) or not isinstance(cap, int | float) or not 0.0 < cap <= 1e6
        ):
            raise UnsupportedModelError(
                f"attention_softcap must be a number in (0, 1e6], not {cap!r}"
            )
        if self.num_experts:
            if not 1 <= self.num_experts <= 1024:
                raise UnsupportedModelError(
                    f"num_experts must be in [1, 1024], not {self.num_experts}"
                )
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise UnsupportedModelError(
                    f"num_experts_per_tok must be in [1, num_experts], "
                    f"not {self.num_experts_per_tok}"
                )
            if not 1 <= self.moe_intermediate_size <= _SHAPE_BOUNDS["intermediate_size"]:
                raise UnsupportedModelError(
                    f"the experts' intermediate size must be in "
                    f"[1, {_SHAPE_BOUNDS['intermediate_size']}], not {self.moe_intermediate_size}"
                )

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of `layer`'s attention, or None (it sees the whole context)."""
        if self.sliding_window is None or layer in self.full_attention_layers:
            return None
        return self.sliding_window

    @property
    def kv_window(self) -> int | None:
        """The window W when every layer has one (Mistral v0.1, Phi-3-mini), else None.

        Only then can a sequence's KV blocks behind its last W positions be given back:
        the pool is one for all layers, so a single full-attention layer needs them all.
        """
        return self.sliding_window if not self.full_attention_layers else None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V per token over all layers, for fp32 (scale for other dtypes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how to run it."""

    path: str
    dtype: torch.dtype = torch.float32
    device: str = "cpu"
    max_model_len: int | None = None  # None: the model's own context length
    revision: str = ""  # part of the cache key; defaults to a digest of the file
    enforce_eager: bool = False  # True: never capture CUDA graphs (debugging, profiling)
    cuda_graph_max_batch: int | None = None  # largest captured decode batch; None: max_num_seqs
    # RMSNorm(+residual), rotary and SiLU-and-mul as triton kernels; "auto": on CUDA only.
    fused_ops: FusedOpsMode = "auto"
    # Weight-only int8/int4 linears on the CPU (engine/model/quant.py); "none": the dtype's;
    # "auto": chosen at load from the model file and the device (`choose_weight_quant`).
    weight_quant: Literal["auto", "none", "int8", "int4"] = "none"
    # Float linears through weights packed for oneDNN (float32 on the CPU; see
    # engine/model/cpu_linear.py). The packed copies double the weights' memory.
    cpu_packed_linears: bool = False


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV pool: fixed-size blocks allocated once from a memory budget."""

    block_size: int = 16
    kv_cache_bytes: int | None = None  # explicit budget; wins over the fraction
    memory_fraction: float = 0.25  # of free memory, when no explicit budget is given (CPU)
    # CUDA (vLLM semantics): the fraction of TOTAL device memory the engine may use;
    # the KV pool gets what is left of it after weights and the profiled activation peak.
    gpu_memory_utilization: float = 0.9
    num_blocks: int | None = None  # tests may pin the pool size directly
    prefix_cache: PrefixCacheMode = "hash"
    # Per-domain floor: cached blocks no other domain's traffic can evict (the larger wins).
    min_cached_blocks: int = 0
    min_cached_share: float = 0.0
    # The default floor against eviction floods: this share of the pool is split evenly
    # among the tenants (domain roots, "t:a" of "t:a/k:1") that cache blocks, and a
    # tenant's cached blocks within its part are never evicted by another tenant's
    # traffic. 0 turns it off; explicit floors (above, or a tenant's rule) still apply.
    fair_cached_share: float = 0.2
    strict_partition: bool = False  # no cross-domain eviction; a domain caches <= its floor
    retention_ttl_s: float | None = None  # idle cached blocks older than this are dropped
    scrub_freed_blocks: bool = False  # zero KV blocks when they leave a domain
    published_prefixes: tuple[tuple[int, ...], ...] = ()  # token ids shared by every domain
    # KV-cache events in vLLM's format over ZeroMQ (engine/kv_events_publisher.py):
    # None publishes nothing; the topic prefixes each message (llm-d: kv@<pod>@<model>).
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    # Where late subscribers ask for batches again (a ROUTER, bound); None: no replay.
    kv_events_replay_endpoint: str | None = None
    kv_events_buffer_steps: int = 10_000  # batches kept for replay
    # The host-memory tier (L2) under the pool, in bytes (0: off): blocks the pool evicts
    # are written down there and loaded back when that is cheaper than recomputing them
    # (engine/kv_cache/host_tier.py). Pinned memory on CUDA, process memory on the CPU.
    kv_host_bytes: int = 0
    # The local-disk tier (L3) under the host tier: a directory (None: off) and its budget
    # in bytes (0: off). Blocks the host tier evicts are written there by a background
    # thread, found again after a restart of the same model, and loaded back through the
    # host tier when that is cheaper than recomputing them (engine/kv_cache/disk_tier.py).
    # It needs the host tier (kv_host_bytes > 0).
    kv_disk_path: str | None = None
    kv_disk_bytes: int = 0

    def __post_init__(self) -> None:
        kv_host = self.kv_host_bytes
        if isinstance(kv_host, bool) or not isinstance(kv_host, int) or kv_host < 0:
            raise ValueError(f"kv_host_bytes must be a non-negative integer, not {kv_host!r}")
        kv_disk = self.kv_disk_bytes
        if isinstance(kv_disk, bool) or not isinstance(kv_disk, int) or kv_disk < 0:
            raise ValueError(f"kv_disk_bytes must be a non-negative integer, not {kv_disk!r}")
        path = self.kv_disk_path
        if path is not None and (not isinstance(path, str) or not path.strip()):
            raise ValueError(f"kv_disk_path must be a directory path or None, not {path!r}")
        if path is not None and kv_disk > 0 and kv_host == 0:
            raise ValueError(
                "kv_disk_path needs the host tier under the pool: set kv_host_bytes > 0 "
                "(the disk tier keeps the blocks the host tier evicts)"
            )


@dataclass(frozen=True)
class SchedulerConfig:
    """Per-step token budget and queue bounds."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_waiting: int = 1024
    max_n: int = 16
    max_tokens_limit: int | None = None  # None: bounded by max_model_len only
    prefill_chunk_size: int | None = None  # None: bounded by the token budget only
    # Inter-token latency budget: each step's prompt tokens are capped so that the step
    # is predicted to fit it, from measured step costs (engine/scheduler/step_budget.py).
    itl_budget_ms: float | None = None
    scheduling_policy: SchedulingPolicy = "fcfs"
    # Fairness key (tenant) -> weight, for the fair policies and the waiting shares.
    domain_weights: tuple[tuple[str, float], ...] = ()
    # Weighted KV shares in the running set (engine/scheduler/kv_shares.py): when the pool
    # is short the preemption victim comes from the tenant most over its share, and a
    # tenant over its share is not admitted while one under its share waits. False: the
    # tenant-blind scheduler of before (newest sequence preempted), for comparisons.
    kv_shares: bool = True
    # Step N+1 scheduled and its inputs built while step N's forward pass runs, its
    # tokens taken while N+1's runs (engine/overlap.py); False: every step in turn.
    overlap_scheduling: bool = True
    # Steps run in turn while the measured forward pass (and sampling) is shorter than
    # this: there is nothing to hide the host's work behind, and handing each step to a
    # second thread and back costs more than it saves (0: always overlap).
    overlap_min_forward_ms: float = 1.0

    def __post_init__(self) -> None:
        least = self.overlap_min_forward_ms
        if isinstance(least, bool) or not isinstance(least, int | float) or not least >= 0:
            raise ValueError(f"overlap_min_forward_ms must be a number >= 0, not {least!r}")


@dataclass(frozen=True)
class StructuredConfig:
    """Constrained decoding: how grammars are compiled and how many stay compiled."""

    grammar_cache_size: int = 256  # compiled grammars kept, least recently used evicted
    grammar_compile_timeout_s: float = 5.0  # a grammar slower than this to compile is refused
    grammar_compile_threads: int = 2  # worker threads that compile, off the step loop
    grammar_max_pending: int = 64  # compiles queued or running; more are refused (503)
    # Host time one request's token masks may take in all, measured each step (a typical
    # mask takes 10-200 us); a request over it is ended ("length", what it got billed),
    # and its constraint is refused for its cache domain from then on.
    grammar_mask_budget_s: float = 5.0

    def __post_init__(self) -> None:
        if self.grammar_cache_size < 1 or self.grammar_compile_threads < 1:
            raise ValueError("the grammar cache and the compile threads need at least 1")
        if not self.grammar_compile_timeout_s > 0 or self.grammar_max_pending < 1:
            raise ValueError("the compile timeout and the pending bound must be positive")
        if not self.grammar_mask_budget_s > 0:
            raise ValueError("grammar_mask_budget_s must be positive")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters: device slots, the host cache of loaded weights and the largest rank."""

    max_loras: int = 4  # adapters resident on the device at once (one slot each)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters' weights kept in host memory; None: all
    # The per-row matmul: "torch" (grouped GEMMs, any device) or "triton" (BGMV kernel).
    lora_kernel: Literal["torch", "triton"] = "torch"
    # With more adapters busy than slots: steps an adapter keeps its slot before it gives
    # way to one that waits (engine/lora/slots.py).
    lora_slot_quantum: int = 4

    def __post_init__(self) -> None:
        if self.max_loras < 1 or self.max_lora_rank < 1 or self.lora_slot_quantum < 1:
            raise ValueError("max_loras, max_lora_rank and lora_slot_quantum must be at least 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be at least max_loras")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: who proposes draft tokens, how many, and up to which batch.

    Every value is checked here, so a bad setting fails at start with its name.
    """

    speculative_method: SpeculativeMethod = "off"
    # Draft tokens proposed per sequence and step at most (adaptive k lowers it per sequence).
    num_speculative_tokens: int = 4
    # The draft model (a folder or GGUF file with the served model's tokenizer): for
    # "draft" only, which needs it.
    speculative_model: str | None = None
    # Running sequences above which no step speculates (None: decided from measured step
    # costs, engine/speculative/batch_gate.py).
    speculative_max_batch: int | None = None

    def __post_init__(self) -> None:
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"not {self.speculative_method!r}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be an integer from 1 to {MAX_SPECULATIVE_TOKENS}, "
                f"not {k!r}"
            )
        batch = self.speculative_max_batch
        if batch is not None and (
            isinstance(batch, bool) or not isinstance(batch, int) or batch < 1
        ):
            raise ValueError(f"speculative_max_batch must be a positive integer, not {batch!r}")
        draft = self.speculative_method == "draft"
        if draft and not self.speculative_model:
            raise ValueError('speculative_method "draft" needs speculative_model (its path)')
        if not draft and self.speculative_model is not None:
            raise ValueError(
                'speculative_model is set, but speculative_method is not "draft" '
                f"({self.speculative_method!r}): say which method should use it"
            )

    @property
    def enabled(self) -> bool:
        """Whether any step may speculate."""
        return self.speculative_method != "off"


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, frozen after construction."""

    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    structured: StructuredConfig = field(default_factory=StructuredConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    attention_backend: AttentionBackendName = "auto"
    seed: int = 0
