"""What each engine request of one API request came to, for the per-request histograms.

vLLM observes its request histograms (prompt and generation lengths, prefill and decode
time, finish reasons) once per finished sequence; `OutcomeTracker` collects the same
figures from the stream events a `RequestLifecycle` sees, one outcome per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.outputs import RequestMetrics, StreamEvent
from engine.request import EngineRequest


@dataclass(frozen=True)
class EngineRequestOutcome:
    """One finished sample: its lengths, how it ended and where its time went."""

    prompt_tokens: int
    generation_tokens: int
    max_tokens: int | None  # what the request allowed (None: up to the context)
    finished_reason: str  # "stop", "length", "abort", ...
    prefill_s: float | None  # first scheduled -> first token
    decode_s: float | None  # first token -> finished


class OutcomeTracker:
    """Collects per-sample token counts and the final timing of each engine request."""

    def __init__(self) -> None:
        self._submitted: dict[str, tuple[int, int | None]] = {}  # id -> (prompt, max_tokens)
        self._tokens: dict[tuple[str, int], int] = {}
        self._reasons: dict[tuple[str, int], str] = {}
        self._metrics: dict[str, RequestMetrics] = {}

    def submitted(self, request: EngineRequest) -> None:
        """Notes one queued engine request."""
        self._submitted[request.request_id] = (
            len(request.prompt_token_ids),
            request.params.max_tokens,
        )

    def observe(self, event: StreamEvent) -> None:
        """Folds in one stream event."""
        for delta in event.deltas:
            key = (event.request_id, delta.index)
            self._tokens[key] = self._tokens.get(key, 0) + len(delta.token_ids)
            if delta.finish_reason is not None:
                self._reasons[key] = delta.finish_reason
        if event.finished and event.metrics is not None:
            self._metrics[event.request_id] = event.metrics

    def outcomes(self) -> list[EngineRequestOutcome]:
        """One outcome per sample that finished (an unfinished one has no reason yet)."""
        found: list[EngineRequestOutcome] = []
        for (request_id, index), reason in self._reasons.items():
            prompt, max_tokens = self._submitted.get(request_id, (0, None))
            m = self._metrics.get(request_id)
            first_token = m.first_token_time if m else None
            prefill = decode = None
            if m is not None and first_token is not None:
                if m.first_scheduled_time is not None:
                    prefill = max(0.0, first_token - m.first_scheduled_time)
                if m.finished_time is not None:
                    decode = max(0.0, m.finished_time - first_token)
            found.append(
                EngineRequestOutcome(
                    prompt_tokens=prompt,
                    generation_tokens=self._tokens.get((request_id, index), 0),
                    max_tokens=max_tokens,
                    finished_reason=reason,
                    prefill_s=prefill,
                    decode_s=decode,
                )
            )
        return found
