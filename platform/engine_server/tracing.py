"""The engine server's span per request: `engine.generate`, a child of the gateway's.

The gateway sends its request span's W3C trace context (`traceparent`, `tracestate`);
the span records GenAI semantic-convention attributes and the engine's queue time.
The server has a tracer only when its command configured an exporter.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.outputs import StreamEvent
from engine.request import EngineRequest

SPAN_NAME = "engine.generate"
_PROPAGATOR = TraceContextTextMapPropagator()


class GenerateSpan:
    """One request's span: started at submit, fed its events, ended once."""

    def __init__(
        self, tracer: Tracer, request: EngineRequest, headers: Mapping[str, str], model: str
    ) -> None:
        traceparent = headers.get("traceparent")
        parent = Context()
        if traceparent is not None:
            carrier = {"traceparent": traceparent}
            if (state := headers.get("tracestate")) is not None:
                carrier["tracestate"] = state
            parent = _PROPAGATOR.extract(carrier)
        params = request.params
        self.span: Span = tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.system": "cloister",
                "gen_ai.operation.name": "text_completion",
                "gen_ai.request.model": model,
                "gen_ai.request.max_tokens": params.max_tokens or 0,
                "gen_ai.request.temperature": params.temperature,
                "gen_ai.request.top_p": params.top_p,
                "gen_ai.response.id": request.request_id,
                "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
            },
        )
        self._output_tokens = 0
        self._finish_reasons: list[str] = []
        self._queue_s: float | None = None
        self._cached = 0
        self._ended = False

    def observe(self, event: StreamEvent) -> None:
        """Counts the event's tokens, finish reasons and the request's queue time."""
        for delta in event.deltas:
            self._output_tokens += len(delta.token_ids)
            if delta.finish_reason is not None:
                self._finish_reasons.append(delta.finish_reason)
        self._cached = event.num_cached_tokens
        m = event.metrics
        if self._queue_s is None and m is not None and m.first_scheduled_time is not None:
            self._queue_s = m.first_scheduled_time - m.arrival_time

    def end(self, error: BaseException | None = None, *, aborted: bool = False) -> None:
        """Sets the totals and ends the span (idempotent)."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        span.set_attribute("gen_ai.usage.output_tokens", self._output_tokens)
        span.set_attribute("cloister.usage.cached_tokens", self._cached)
        reasons = self._finish_reasons or (["abort"] if aborted else [])
        if reasons:
            span.set_attribute("gen_ai.response.finish_reasons", reasons)
        if self._queue_s is not None:
            span.set_attribute("cloister.engine.queue_time_s", self._queue_s)
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        span.end()
