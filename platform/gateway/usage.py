"""The metering seam: one `UsageRecord` per request id, handed to a `UsageSink` once."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

logger = logging.getLogger("cloister.usage")


@dataclass(frozen=True)
class UsageRecord:
    """What one request consumed and how it ended. Partial output counts on disconnect.

    The token counts are what the engine processed, and so what is billed: a request
    refused before the engine ran it (429, 503, 400) carries zeros and its status.
    """

    request_id: str
    tenant_id: str
    key_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    latency_s: float
    # The HTTP status the client got (200 also for a stream cut short; the engine's failure
    # status, with finish_reason "engine_error", for a stream the engine failed mid-way).
    status: int
    finish_reason: str | None
    client_disconnected: bool
    adapter: str | None = None  # the LoRA adapter served, when there is one
    # The client's x-request-id, if it sent a valid one: not unique (retries, other
    # tenants), so stored beside `request_id`, never as a key.
    client_request_id: str | None = None
    # A line of a tenant's batch (the Batch API): billed at the model's batch price.
    batch: bool = False


class UsageSink(Protocol):
    """Receives each request's usage exactly once; must not raise into the request path."""

    def record(self, usage: UsageRecord) -> None:
        """Stores or forwards one record. Called once per request id."""
        ...


@runtime_checkable
class DurableUsageSink(UsageSink, Protocol):
    """A sink that can also say when a record is durable (survives `kill -9`)."""

    async def persist(self, usage: UsageRecord) -> None:
        """Stores the record; returns once it is durable. Must not raise."""
        ...


class LoggingUsageSink:
    """Default sink: one structured log line per request (the admin service stores them later)."""

    def record(self, usage: UsageRecord) -> None:
        """Logs the record as the `usage` extra field."""
        logger.info("usage", extra={"usage": asdict(usage)})


class UsageGuard:
    """Makes the exactly-once rule local: a second `emit` for the same request is ignored."""

    def __init__(self, sink: UsageSink) -> None:
        self._sink = sink
        self._done = False

    @property
    def emitted(self) -> bool:
        """True once the record went out."""
        return self._done

    def emit(self, usage: UsageRecord) -> None:
        """Hands `usage` to the sink the first time; sink failures are logged, not raised."""
        if self._done:
            return
        self._done = True
        try:
            self._sink.record(usage)
        except Exception:  # a metering outage must not fail the tenant's request
            logger.exception("usage sink failed", extra={"request_id": usage.request_id})

    async def emit_durably(self, usage: UsageRecord) -> None:
        """Like `emit`, but returns once the record is durable when the sink can say so."""
        if self._done:
            return
        if not isinstance(self._sink, DurableUsageSink):
            self.emit(usage)
            return
        self._done = True
        try:
            await self._sink.persist(usage)
        except Exception:
            logger.exception("usage sink failed", extra={"request_id": usage.request_id})
