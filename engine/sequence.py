"""Token-level state of one sequence (one of a request's `n` samples). State only, no logic
beyond what is derived from the state itself."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.request import EngineRequest
from engine.sampling_params import SamplingParams

# Stands for a token an in-flight step is sampling (overlap scheduling, engine/overlap.py):
# appended when the step is launched so the next one can be scheduled, replaced by the
# real token when the step's result is taken. Never a vocabulary id.
PENDING_TOKEN = -1


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One sample being generated. The scheduler owns its queue position and blocks.

    `num_computed_tokens` counts the tokens whose K/V are in the cache; it catches
    up with `num_tokens` through prefill chunks, then grows by one per decode step.
    After a preemption it drops to 0 and the whole sequence, outputs included, is
    recomputed as if it were a prompt.
    """

    seq_id: str
    # The request this is a sample of: its per-request fields (ids, params, cache domain,
    # adapter, tenant, priority, class) are read through it, never copied.
    request: EngineRequest
    index: int
    # The request's prompt as a list: the hot paths join it with the outputs, the
    # engine shares one list among a request's samples, and the draft model's shadow
    # (engine/speculative/draft.py) replaces it with the whole known sequence.
    prompt_token_ids: list[int]
    max_tokens: int  # resolved from params and the context length
    arrival_time: float = 0.0
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Of those, the tokens a launched step is still computing (overlap scheduling): their
    # K/V are not written yet, so their blocks are not in the prefix cache yet.
    num_unsettled_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    # Grows in place only (append/extend); any other change assigns a new list, which
    # the runner's block table (engine/runner/block_table.py) notices by identity.
    block_ids: list[int] = field(default_factory=list)
    # Leading entries of `block_ids` given back because no later token can see them (a
    # model whose every layer has a sliding window); they read 0, the table's padding.
    num_released_blocks: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    admitted_once: bool = False
    # The loaded LoRA adapter's content digest (None: `adapter` only names a cache key),
    # and the device slot it holds from admission to its end (None: not placed yet).
    adapter_digest: str | None = None
    lora_slot: int | None = None
    # Draft tokens proposed for the positions after the last known token, to be verified
    # by the next step (engine/speculative/); empty when this sequence does not speculate.
    spec_token_ids: list[int] = field(default_factory=list)
    # Uniforms drawn beyond one per output token: one per sampled verify row that rejected
    # a draft (the runner replays the draws when a failed step is retried).
    spec_extra_draws: int = 0

    @property
    def request_id(self) -> str:
        """The request's id (shared by its `n` samples)."""
        return self.request.request_id

    @property
    def params(self) -> SamplingParams:
        """The request's sampling parameters."""
        return self.request.params

    @property
    def cache_domain(self) -> str:
        """Whose prefix cache this sequence reads and writes."""
        return self.request.cache_domain

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter's name, or None for the base model."""
        return self.request.adapter

    @property
    def use_cache(self) -> bool:
        """False when the request neither reads nor writes the prefix cache."""
        return self.request.cache

    @property
    def fairness_key(self) -> str:
        """Whose share of the scheduler this sequence uses (the tenant; by default its
        cache domain). Separate from the domain, so that a tenant with per-key or
        per-user isolation still gets one share, not one per key."""
        return self.request.fairness_key

    @property
    def priority(self) -> int:
        """Order among the waiting sequences of one fairness key (lower first), under
        the fair policies; never an order across keys."""
        return self.request.priority

    @property
    def batch(self) -> bool:
        """Batch work: runs in the capacity interactive work leaves and is preempted
        first (engine/scheduler/traffic.py)."""
        return self.request.traffic_class == "batch"

    @property
    def cache_adapter(self) -> str | None:
        """The adapter's part of the cache key: name and content digest, so that an
        adapter reloaded with new weights never reads the old one's KV."""
        if self.adapter is None or self.adapter_digest is None:
            return self.adapter
        return f"{self.adapter}@{self.adapter_digest}"

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens so far."""
        return len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output, without building the whole list."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    @property
    def has_pending_token(self) -> bool:
        """True while its last token is still being sampled by an in-flight step."""
        return bool(self.output_token_ids) and self.output_token_ids[-1] == PENDING_TOKEN

    def drop_pending_token(self) -> bool:
        """Forgets a token still being sampled (the sequence ends or starts over); True
        when there was one."""
        if self.has_pending_token:
            self.output_token_ids.pop()
            return True
        return False

    @property
    def held_block_ids(self) -> list[int]:
        """The blocks this sequence holds a reference to (`block_ids` past the released)."""
        return self.block_ids[self.num_released_blocks :]

    @property
    def num_held_blocks(self) -> int:
        """How many blocks this sequence holds (what it costs its tenant's KV share)."""
        return len(self.block_ids) - self.num_released_blocks

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt plus generated tokens, as one new list."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        """True once the sequence has a finish reason."""
        return self.status is SequenceStatus.FINISHED
