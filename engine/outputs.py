"""What the engine hands back: per-request outputs, and the deltas it streams."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one token, with its decoded text."""

    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True)
class PositionLogprobs:
    """The chosen token's logprob at one position, plus the top alternatives."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass
class CompletionOutput:
    """One of the `n` samples of a request. Grows while the request streams."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or token id that ended it

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of one request as returned by `LLM.generate` (final) or streamed (partial)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False
    metrics: RequestMetrics | None = None


@dataclass(frozen=True)
class CompletionDelta:
    """New text and tokens of one sample since the last stream event."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[PositionLogprobs, ...] | None
    finish_reason: str | None


@dataclass(frozen=True)
class RequestMetrics:
    """Timing of one request, in seconds since the epoch (time.time())."""

    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    num_preemptions: int = 0


@dataclass(frozen=True)
class StreamEvent:
    """One streaming step of one request: the deltas of the samples that moved."""

    request_id: str
    deltas: tuple[CompletionDelta, ...]
    prompt_token_ids: tuple[int, ...]
    num_cached_tokens: int
    finished: bool
    metrics: RequestMetrics | None = None

    def with_prompt(self, prompt_token_ids: tuple[int, ...]) -> StreamEvent:
        """This event carrying `prompt_token_ids` (cheaper than `dataclasses.replace`)."""
        return StreamEvent(
            self.request_id,
            self.deltas,
            prompt_token_ids,
            self.num_cached_tokens,
            self.finished,
            self.metrics,
        )
