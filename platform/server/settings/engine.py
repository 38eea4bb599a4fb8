"""The engine's settings (`settings.engine`; CLOISTER_ENGINE__NAME or CLOISTER_NAME).

They reach `engine.config.EngineConfig` through `assembly.engine_options`, for the
engine `cloister serve` runs in process and for `cloister engine serve` alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.kv_events_endpoint import binds, check_endpoint


class EngineSettings(BaseModel):
    """Device, kernels, KV cache and its tiers, scheduling, LoRA and speculative decoding."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # "auto": CUDA when a GPU is there, else the CPU; on CUDA bf16 and triton attention,
    # on the CPU fp32 and the cpu backend (the torch reference with a paged numba kernel
    # for decode rows; the reference without numba).
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # The weights' and activations' float type; auto: bfloat16 on CUDA, float32 on the CPU.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # Weight-only int8/int4 linears, CPU only: "int4" is the fast path for the bundled
    # (Q4_1) SmolLM2, whose stored weights it re-finds (engine/model/quant.py). "auto":
    # each model file's own path on the CPU (int4 for Q4 GGUFs, int8 for Q5/Q6/Q8), float
    # for float checkpoints and on CUDA (choose_weight_quant). Not the default yet: its
    # shorter steps leave a noisy neighbour's fixed costs a larger share of the victim's
    # ITL, past tests/reliability/test_noisy_neighbour.py's 1.5x of a fair neighbour.
    weight_quant: Literal["auto", "none", "int8", "int4"] = "none"
    # Float32 linears on the CPU through weights packed once for oneDNN: a step of a few
    # rows costs about what one row does, for as much memory again as the weights. On by
    # default: torch's own fp32 linears on one thread cost two to three times as much at
    # two or three rows as at one, so the victim of a noisy neighbour (and of a merely
    # fair one) paid for each extra row, by an amount that differed from CPU to CPU. No
    # effect on the GPU or on quantized weights.
    cpu_packed_linears: bool = True
    # The attention kernels; auto: triton on CUDA, cpu on the CPU.
    attention_backend: Literal["torch", "cpu", "triton", "auto"] = "auto"
    # RMSNorm(+residual), rotary and SiLU-and-mul as fused triton kernels: "auto" is on
    # exactly on CUDA (with triton), "on" refuses to start anywhere else.
    fused_ops: Literal["auto", "on", "off"] = "auto"
    # How cached prompt blocks are found, always within one cache domain.
    prefix_cache: Literal["hash", "radix", "off"] = "hash"
    # Fair across tenants (virtual token counters, weighted by the tenant's weight),
    # longest prefix match within one tenant's own queue.
    scheduling_policy: Literal["fair_lpm", "fair", "lpm", "fcfs"] = "fair_lpm"
    # Prompt and decode tokens one step may carry.
    max_num_batched_tokens: int = Field(default=2048, ge=1)
    # The most prompt tokens of one sequence a step takes (unset: the step's).
    prefill_chunk_size: int | None = Field(default=None, ge=1)
    # Inter-token latency budget per step: prompt tokens per step are capped from the
    # engine's measured step costs so that a step fits it ("off": the token budget only).
    itl_budget_ms: float | None = Field(default=200.0, gt=0.0, le=60_000.0)
    # KV-cache events in vLLM's format (ZeroMQ + msgpack) for llm-d's prefix-cache scorer:
    # tcp://*:PORT binds, tcp://HOST:PORT connects to a subscriber that binds; unset: off.
    kv_events_endpoint: str | None = None
    # The topic of each message; unset: kv@<host name>@<served model>, llm-d's form.
    kv_events_topic: str | None = Field(default=None, max_length=256)
    # Where a subscriber that joined late or missed batches asks for them again, as from
    # vLLM's replay socket (bound: tcp://*:PORT or ipc://path); unset: no replay.
    kv_events_replay_endpoint: str | None = None
    kv_events_buffer_steps: int = Field(default=10_000, ge=1, le=1_000_000)  # kept for replay
    # Tokens per KV-cache block (and per prefix-cache hash).
    block_size: int = Field(default=16, ge=1, le=1024)
    # The KV pool: an explicit budget in bytes, else (on CUDA) this fraction of the GPU.
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    retention_ttl_s: float | None = Field(default=None, gt=0.0)  # idle cached blocks
    scrub_freed_blocks: bool = False  # zero KV blocks when they leave a cache domain
    strict_partition: bool = False  # no cross-domain eviction; domains cache <= their floor
    # Every cache domain's floor: cached blocks no other domain's traffic evicts (the larger).
    min_cached_blocks: int = Field(default=0, ge=0)
    # The same floor as a share of the pool.
    min_cached_share: float = Field(default=0.0, ge=0.0, le=1.0)
    # The default floor against eviction floods: this share of the KV pool is split evenly
    # among the tenants that cache blocks; within its part no other tenant evicts a
    # tenant's cached blocks (0: off).
    fair_cached_share: float = Field(default=0.2, ge=0.0, le=1.0)
    # Weighted KV shares in the running set: under contention the preemption victim comes
    # from the tenant most over its share (false: the tenant-blind newest-first of before).
    kv_shares: bool = True
    # Overlap scheduling: the next step is scheduled and its inputs built while the
    # current step's forward pass runs, and the current step's tokens are taken while the
    # next one runs (engine/overlap.py). Steps whose rows need the previous token on the
    # host (grammars, penalties, logit bias, min_tokens) run in turn, and so does every
    # step with speculative decoding or KV tiers. False: every step in turn.
    overlap_scheduling: bool = True
    # Overlap only while a step's forward pass (and sampling) measures at least this
    # long; shorter (a tiny model), each step runs in turn, since handing it to the host
    # thread and back costs more than the overlap hides (0: overlap whatever it measures).
    overlap_min_forward_ms: float = Field(default=1.0, ge=0.0, le=60_000.0)
    # Constrained decoding: the longest a grammar may take to compile (then a 400, and the
    # spec is refused from then on), and the host time one request's token masks may take
    # in all (then it ends with "length", billed, and its grammar is refused).
    grammar_compile_timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    # See grammar_compile_timeout_s.
    grammar_mask_budget_s: float = Field(default=5.0, gt=0.0, le=3600.0)
    enforce_eager: bool = False  # never capture CUDA graphs
    # Where the engine loop runs: "thread" (a thread of the server process, the embedded
    # default) or "process" (a child process of its own, so that the HTTP event loop and
    # the engine never wait for each other's GIL; the better choice under load).
    engine_mode: Literal["thread", "process"] = "thread"
    # The KV pool's size in bytes (unset: from gpu_memory_utilization, or a CPU default).
    kv_cache_bytes: int | None = Field(default=None, ge=1)
    # The host-memory KV tier (L2) under the pool, in bytes (0: off): blocks the pool
    # evicts are kept there under the same tenant-rooted key and loaded back when that is
    # cheaper than recomputing them. Negative is refused; more than the host has is
    # clamped with a warning.
    kv_host_bytes: int = Field(default=0, ge=0)
    # The local-disk KV tier (L3) under the host tier: a directory and its budget in bytes
    # (unset or 0: off; it needs kv_host_bytes). Blocks the host tier evicts are written
    # there off the step path, under the same tenant-rooted keys, and found again after a
    # restart of the same model; a path that is a file or unwritable is refused at start.
    kv_disk_path: str | None = None
    # The disk tier's budget in bytes (0: off).
    kv_disk_bytes: int = Field(default=0, ge=0)
    # Speculative decoding (engine/speculative/): "ngram" proposes up to
    # num_speculative_tokens draft tokens from the request's own tokens (never another
    # request's) and verifies them in one pass, so greedy output is unchanged; "off":
    # none. speculative_max_batch: running sequences above which no step speculates
    # (unset: the engine decides from its measured step costs). "draft" runs a small
    # draft model, speculative_model (a folder or GGUF with the served model's
    # tokenizer), which only "draft" takes. The choices and the bound repeat
    # engine.config's (SPECULATIVE_METHODS, MAX_SPECULATIVE_TOKENS), which this module
    # does not import (it would load torch for every CLI command); a test keeps them equal.
    speculative_method: Literal["off", "ngram", "draft"] = "off"
    # Draft tokens proposed per sequence and step at most.
    num_speculative_tokens: int = Field(default=4, ge=1, le=16)
    # The draft model of the draft method: a GGUF file or model folder.
    speculative_model: str | None = None
    # Running sequences above which no step speculates.
    speculative_max_batch: int | None = Field(default=None, ge=1)
    # Sequences running at once.
    max_num_seqs: int = Field(default=64, ge=1)
    # LoRA adapters (engine/lora/): device slots, adapters' weights kept in host memory
    # (None: all loaded ones), the largest rank, the per-row matmul, and the steps an
    # adapter keeps its slot before one that waits gets a turn.
    max_loras: int = Field(default=4, ge=1, le=1024)
    # Adapters kept in host memory (unset: every loaded one).
    max_cpu_loras: int | None = Field(default=None, ge=1)
    # The largest adapter rank (uploads of larger ones are refused).
    max_lora_rank: int = Field(default=16, ge=1, le=1024)
    # The per-row LoRA matmul: torch, or triton on CUDA.
    lora_kernel: Literal["torch", "triton"] = "torch"
    # Steps an adapter keeps its slot while another waits for one.
    lora_slot_quantum: int = Field(default=4, ge=1, le=100_000)
    # Sequences the engine queues at most; a request that needs more is refused.
    max_waiting: int = Field(default=256, ge=1)
    # The longest prompt plus output (unset: the model's own limit).
    max_model_len: int | None = Field(default=8192, ge=1)
    max_n: int = Field(default=16, ge=1)  # most choices one request may ask for

    @field_validator("kv_events_endpoint", "kv_events_replay_endpoint")
    @classmethod
    def _check_kv_events_endpoint(cls, value: str | None) -> str | None:
        """A ZeroMQ tcp:// or ipc:// address (empty: off)."""
        if value is None or not value.strip():
            return None
        return check_endpoint(value.strip())

    @field_validator("kv_events_replay_endpoint")
    @classmethod
    def _check_kv_events_replay_binds(cls, value: str | None) -> str | None:
        """The replay socket binds its address."""
        if value is not None and not binds(value):
            raise ValueError(
                f"the KV events replay socket binds, so its endpoint is tcp://*:PORT or "
                f"ipc://path, not {value!r}"
            )
        return value

    @field_validator("itl_budget_ms", mode="before")
    @classmethod
    def _parse_itl_budget(cls, value: Any) -> Any:
        """`off` (or `none`, or empty) turns the ITL budget off."""
        if isinstance(value, str) and value.strip().lower() in ("", "off", "none"):
            return None
        return value

    @field_validator("speculative_model", "kv_disk_path", mode="before")
    @classmethod
    def _empty_path_is_unset(cls, value: Any) -> Any:
        """An empty value (CLOISTER_SPECULATIVE_MODEL=, CLOISTER_KV_DISK_PATH=) is unset."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @model_validator(mode="after")
    def _replay_needs_its_publisher(self) -> EngineSettings:
        """A replay socket replays the batches of this engine's own publisher."""
        endpoint, replay = self.kv_events_endpoint, self.kv_events_replay_endpoint
        if replay is not None:
            if endpoint is None:
                raise ValueError(
                    "kv_events_replay_endpoint replays kv_events_endpoint's batches; set both"
                )
            if replay == endpoint:
                raise ValueError("kv_events_replay_endpoint must differ from kv_events_endpoint")
        return self

    @model_validator(mode="after")
    def _draft_model_exactly_with_the_draft_method(self) -> EngineSettings:
        # The engine refuses these too (engine.config.SpeculativeConfig), but only once the
        # model is loading; here they stop `cloister serve` before anything starts.
        draft = self.speculative_method == "draft"
        if draft and self.speculative_model is None:
            raise ValueError('speculative_method "draft" needs speculative_model (its path)')
        if not draft and self.speculative_model is not None:
            raise ValueError(
                f"speculative_model is set ({self.speculative_model!r}), but "
                f'speculative_method is {self.speculative_method!r}, not "draft": only the '
                "draft method runs a draft model"
            )
        # A missing draft would otherwise surface only after the served model has loaded
        # (minutes on a CPU); its vocabulary is checked by the engine as it loads it.
        if draft and not Path(str(self.speculative_model)).expanduser().exists():
            raise ValueError(
                f"speculative_model {self.speculative_model!r}: no such file or folder "
                "(a GGUF file or a Hugging Face model folder on this machine)"
            )
        return self

    @model_validator(mode="after")
    def _refuse_fewer_host_loras_than_slots(self) -> EngineSettings:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                "max_cpu_loras must be at least max_loras (every slot has a host copy)"
            )
        return self
