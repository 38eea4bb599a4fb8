"""The capacity worksheet: KV bytes per token, the KV budget, concurrency and replicas.

It follows the serving guide's sizing steps (bytes per token from the real layer and
head counts; the per-replica budget after weights and overhead; resident tokens and
concurrency; Little's law with output length and inter-token latency; headroom for
the tail of the prompt-length distribution; replicas for a peak rate). Memory is in
decimal bytes, as the guide's worked example uses it. The numbers are a sizing
skeleton to be replaced by measurement, never a prediction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from engine.config import ModelArchitecture
from engine.errors import InvalidRequestError

# Bytes per stored element of the KV cache, by the dtype names operators use.
KV_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class CapacityInputError(InvalidRequestError):
    """A worksheet input is missing, negative or inconsistent."""

    code = "invalid_capacity_input"


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache and the weights of a decoder cost: its attention shape and size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_params: int | None = None  # None: weights must be given as bytes
    # What one token runs through (a mixture of experts' top-k, not all experts).
    active_params: int | None = None
    context_limit: int | None = None  # the model's context length
    # The window every layer has (ModelArchitecture.kv_window): a sequence then holds at
    # most its last `kv_window` tokens' KV, its blocks behind it given back.
    kv_window: int | None = None

    @classmethod
    def from_architecture(cls, arch: ModelArchitecture) -> ModelShape:
        """The shape of a model of any registered family, from its config or GGUF header."""
        return cls(
            arch.num_layers,
            arch.num_kv_heads,
            arch.head_dim,
            count_parameters(arch),
            count_active_parameters(arch),
            arch.max_position_embeddings,
            arch.kv_window,
        )

    def held_tokens(self, tokens: float) -> float:
        """KV tokens a sequence of `tokens` holds (its last `kv_window` on a window model)."""
        return tokens if self.kv_window is None else min(tokens, self.kv_window)

    def kv_bytes_per_token(self, kv_dtype: str) -> int:
        """2 (K and V) x layers x KV heads x head dim x bytes per element."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _dtype_bytes(kv_dtype)


@dataclass(frozen=True)
class Hardware:
    """One replica: `ranks` devices of `device_memory_bytes` each, weights sharded over them."""

    device_memory_bytes: int
    ranks: int = 1
    weight_bytes: int | None = None  # all ranks together; None: from the parameter count
    overhead_bytes_per_rank: int = 0  # activations, workspace, graphs, safety headroom


@dataclass(frozen=True)
class Workload:
    """The traffic to size for (means, the prompt tail and the peak arrival rate)."""

    mean_prompt_tokens: int
    mean_output_tokens: int
    itl_s: float  # measured mean gap between output tokens
    p99_prompt_tokens: int | None = None
    peak_rps: float | None = None
    context_tokens: int | None = None  # a conversation size to express concurrency in


@dataclass(frozen=True)
class CapacityPlan:
    """Every line of the worksheet; `None` where an input for that line was not given."""

    kv_bytes_per_token: int
    kv_bytes_per_token_by_dtype: dict[str, int]
    weight_bytes_per_rank: int
    kv_budget_bytes_per_rank: int
    replica_kv_bytes: int
    token_capacity: int
    mean_resident_tokens: float
    concurrency_at_mean: int
    concurrency_at_context: int | None
    decode_residency_s: float
    concurrent_requests_at_peak: float | None
    kv_required_at_peak_bytes: float | None
    replicas_for_peak: int | None
    p99_to_mean_prompt: float | None
    concurrency_at_p99: int | None
    replicas_for_peak_at_p99: int | None
    # From the model, when one was read: its weights (all experts), what one token
    # runs through, and the longest context it serves.
    num_params: int | None = None
    active_params: int | None = None
    context_limit: int | None = None
    kv_window: int | None = None  # resident figures count at most this many per request

    def to_dict(self) -> dict[str, object]:
        """JSON-ready values."""
        return asdict(self)


def plan_capacity(
    shape: ModelShape,
    hardware: Hardware,
    workload: Workload,
    *,
    kv_dtype: str = "fp16",
    weight_dtype: str = "fp16",
) -> CapacityPlan:
    """Fills in the worksheet; raises `CapacityInputError` on inputs that make no sense."""
    _check_inputs(shape, hardware, workload)
    per_token = shape.kv_bytes_per_token(kv_dtype)
    weights = hardware.weight_bytes
    if weights is None:
        if shape.num_params is None:
            raise CapacityInputError("give the weights' size or a model to count them from")
        weights = shape.num_params * _dtype_bytes(weight_dtype)
    weights_per_rank = math.ceil(weights / hardware.ranks)
    budget = hardware.device_memory_bytes - weights_per_rank - hardware.overhead_bytes_per_rank
    if budget <= 0:
        raise CapacityInputError(
            f"no room for a KV cache: {hardware.device_memory_bytes} bytes per rank hold "
            f"{weights_per_rank} of weights and {hardware.overhead_bytes_per_rank} of overhead"
        )
    replica_kv = budget * hardware.ranks
    capacity = replica_kv // per_token
    # A request holds its prompt and, on average over its life, half of its output (on a
    # model with a window on every layer, no more than the window).
    resident = shape.held_tokens(workload.mean_prompt_tokens + workload.mean_output_tokens / 2)
    residency_s = workload.mean_output_tokens * workload.itl_s
    peak_concurrency = kv_at_peak = replicas = None
    if workload.peak_rps is not None:
        peak_concurrency = workload.peak_rps * residency_s  # Little's law
        kv_at_peak = peak_concurrency * resident * per_token
        replicas = math.ceil(kv_at_peak / replica_kv)
    tail_ratio = concurrency_p99 = replicas_p99 = None
    if workload.p99_prompt_tokens is not None:
        tail_ratio = workload.p99_prompt_tokens / workload.mean_prompt_tokens
        p99_resident = shape.held_tokens(
            workload.p99_prompt_tokens + workload.mean_output_tokens / 2
        )
        concurrency_p99 = int(capacity // p99_resident)
        if peak_concurrency is not None:
            replicas_p99 = math.ceil(peak_concurrency * p99_resident * per_token / replica_kv)
    context = workload.context_tokens
    if context is not None and shape.context_limit is not None and context > shape.context_limit:
        raise CapacityInputError(
            f"context_tokens {context} exceed the model's longest context, "
            f"{shape.context_limit} tokens"
        )
    return CapacityPlan(
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_by_dtype={d: shape.kv_bytes_per_token(d) for d in KV_DTYPE_BYTES},
        weight_bytes_per_rank=weights_per_rank,
        kv_budget_bytes_per_rank=budget,
        replica_kv_bytes=replica_kv,
        token_capacity=capacity,
        mean_resident_tokens=resident,
        concurrency_at_mean=int(capacity // resident),
        concurrency_at_context=(
            None if context is None else int(capacity // shape.held_tokens(context))
        ),
        decode_residency_s=residency_s,
        concurrent_requests_at_peak=peak_concurrency,
        kv_required_at_peak_bytes=kv_at_peak,
        replicas_for_peak=replicas,
        p99_to_mean_prompt=tail_ratio,
        concurrency_at_p99=concurrency_p99,
        replicas_for_peak_at_p99=replicas_p99,
        num_params=shape.num_params,
        active_params=shape.active_params,
        context_limit=shape.context_limit,
        kv_window=shape.kv_window,
    )


def count_parameters(arch: ModelArchitecture) -> int:
    """Weights of a decoder of any registered family: embeddings, attention, MLP, norms
    and the head."""
    hidden, heads_dim = arch.hidden_size, arch.num_heads * arch.head_dim
    kv_dim = arch.num_kv_heads * arch.head_dim
    attention = hidden * heads_dim * 2 + hidden * kv_dim * 2  # q and o; k and v
    if arch.attention_bias:
        attention += heads_dim + 2 * kv_dim
    if arch.output_bias:
        attention += hidden
    if arch.qk_norm:
        attention += 2 * arch.head_dim
    dense = 3 * hidden * arch.intermediate_size
    sparse = arch.num_experts * (hidden + 3 * hidden * arch.moe_intermediate_size)
    mlps = sum(sparse if arch.is_moe_layer(i) else dense for i in range(arch.num_layers))
    norms = 4 if arch.sandwich_norms else 2  # Gemma norms both sides of each block
    per_layer = attention + norms * hidden
    embeddings = arch.vocab_size * hidden
    head = 0 if arch.tie_word_embeddings else embeddings
    return embeddings + arch.num_layers * per_layer + mlps + hidden + head


def count_active_parameters(arch: ModelArchitecture) -> int:
    """Weights one token runs through: a mixture-of-experts layer's router and its
    top-k experts, not all of them (the same as `count_parameters` for dense models)."""
    if not arch.num_experts:
        return count_parameters(arch)
    idle = arch.num_experts - arch.num_experts_per_tok
    per_expert = 3 * arch.hidden_size * arch.moe_intermediate_size
    moe_layers = sum(arch.is_moe_layer(i) for i in range(arch.num_layers))
    return count_parameters(arch) - moe_layers * idle * per_expert


def _dtype_bytes(name: str) -> int:
    try:
        return KV_DTYPE_BYTES[name]
    except KeyError:
        raise CapacityInputError(
            f"dtype must be one of {', '.join(KV_DTYPE_BYTES)}, got {name!r}"
        ) from None


def _check_inputs(shape: ModelShape, hardware: Hardware, workload: Workload) -> None:
    positive = {
        "layers": shape.num_layers,
        "kv heads": shape.num_kv_heads,
        "head dim": shape.head_dim,
        "device memory": hardware.device_memory_bytes,
        "ranks": hardware.ranks,
        "mean prompt tokens": workload.mean_prompt_tokens,
        "mean output tokens": workload.mean_output_tokens,
    }
    for name, value in positive.items():
        if value <= 0:
            raise CapacityInputError(f"{name} must be positive, got {value}")
    optional_positive = {
        "p99 prompt tokens": workload.p99_prompt_tokens,
        "peak requests per second": workload.peak_rps,
        "context tokens": workload.context_tokens,
        "weights": hardware.weight_bytes,
    }
    for name, maybe in optional_positive.items():
        if maybe is not None and (not math.isfinite(maybe) or maybe <= 0):
            raise CapacityInputError(f"{name} must be positive, got {maybe}")
    if not math.isfinite(workload.itl_s) or workload.itl_s <= 0:
        raise CapacityInputError(f"inter-token latency must be positive, got {workload.itl_s}")
    if hardware.overhead_bytes_per_rank < 0:
        raise CapacityInputError("overhead must not be negative")
    p99 = workload.p99_prompt_tokens
    if p99 is not None and p99 < workload.mean_prompt_tokens:
        raise CapacityInputError("the p99 prompt length is below the mean prompt length")
