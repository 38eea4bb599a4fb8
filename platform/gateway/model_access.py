"""Which tenants may use each model, as the registry says: read off the loop, kept in memory.

The registry (admin's `registry_models.allowed_tenants`) lists, per model, the tenant
IDS that may use it (None: every tenant). The gateway never imports admin: the
wiring hands it a blocking `ModelAccessReader`, and `ModelAccess` caches its answer
like the key cache does:

    age <  refresh_s / 2   answer from memory (the hot path)
    age <  refresh_s       answer from memory, and re-read in the background
    otherwise              await one threaded read (single-flight), then answer

so a change made through the admin API is seen within `refresh_s` plus one read.
The reader may answer a `RegistryView` instead, which adds each model's own
`max_output_tokens` (the gateway applies it beside the key's; see gateway.params) and
its overload fallback (see gateway.generation.submit_with_fallback).
When the read fails (or takes longer than `read_timeout_s`) the last answer is kept
and the failure logged; for `retry_s` no request waits on the registry again. A
request is never answered 5xx for the registry's sake.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType

logger = logging.getLogger("cloister.gateway")

# Model name -> the tenant ids that may use it (None: every tenant). A model the
# registry does not list is not restricted by it (keys and tenant limits still are).
AccessMap = Mapping[str, frozenset[str] | None]


@dataclass(frozen=True)
class RegistryView:
    """What the registry says per model: who may use it, its output cap (model name ->
    `max_output_tokens`; a model without one is capped by its context alone) and its
    fallback under overload (model name -> the fallback model's name)."""

    allowed: AccessMap
    output_caps: Mapping[str, int] = field(default_factory=dict)
    fallbacks: Mapping[str, str] = field(default_factory=dict)


# Blocking (reads the database): run only in ModelAccess's own thread.
ModelAccessReader = Callable[[], AccessMap | RegistryView]


@dataclass(frozen=True)
class AccessSnapshot:
    """One answer of the reader and when it was read."""

    loaded_at: float
    allowed: AccessMap
    output_caps: Mapping[str, int] = field(default_factory=dict)
    fallbacks: Mapping[str, str] = field(default_factory=dict)

    def allows(self, model: str, tenant_id: str) -> bool:
        """Whether the registry lets `tenant_id` use `model`."""
        tenants = self.allowed.get(model)
        return tenants is None or tenant_id in tenants


class ModelAccess:
    """An async, cached front for a `ModelAccessReader`; see the module docstring."""

    def __init__(
        self,
        reader: ModelAccessReader,
        initial: AccessMap | RegistryView,
        *,
        refresh_s: float,
        read_timeout_s: float = 5.0,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reader = reader
        self._refresh_s = refresh_s
        self._read_timeout_s = read_timeout_s
        self._retry_s = retry_s
        self._clock = clock
        self._snapshot = _snapshot(clock(), initial)
        self._loading: asyncio.Future[AccessSnapshot] | None = None
        self._unavailable_until = 0.0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="cloister-models")

    @classmethod
    def load(
        cls,
        reader: ModelAccessReader,
        *,
        refresh_s: float,
        read_timeout_s: float = 5.0,
        retry_s: float = 1.0,
    ) -> ModelAccess:
        """Reads the registry once now (blocking: at start-up, before serving)."""
        return cls(
            reader, reader(), refresh_s=refresh_s, read_timeout_s=read_timeout_s, retry_s=retry_s
        )

    @property
    def snapshot(self) -> AccessSnapshot:
        """The last answer, whatever its age (no read)."""
        return self._snapshot

    async def current(self) -> AccessSnapshot:
        """An answer at most `refresh_s` old, or the last one while the registry is down."""
        now = self._clock()
        age = now - self._snapshot.loaded_at
        if age < self._refresh_s:
            if age >= self._refresh_s / 2 and now >= self._unavailable_until:
                self._start_read()
            return self._snapshot
        if now < self._unavailable_until:
            return self._snapshot
        read = self._start_read()
        try:
            return await asyncio.wait_for(asyncio.shield(read), self._read_timeout_s)
        except Exception:  # an error is logged by _read_done; the last answer stands
            self._unavailable_until = self._clock() + self._retry_s
            return self._snapshot

    def close(self) -> None:
        """Stops the read thread (at shutdown)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _start_read(self) -> asyncio.Future[AccessSnapshot]:
        if self._loading is None:
            loop = asyncio.get_running_loop()
            self._loading = asyncio.ensure_future(self._read(loop))
            self._loading.add_done_callback(self._read_done)
        return self._loading

    async def _read(self, loop: asyncio.AbstractEventLoop) -> AccessSnapshot:
        started = self._clock()  # an answer never claims to be newer than its read
        answer = await loop.run_in_executor(self._pool, self._reader)
        return _snapshot(started, answer)

    def _read_done(self, future: asyncio.Future[AccessSnapshot]) -> None:
        self._loading = None
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            self._snapshot = future.result()
            self._unavailable_until = 0.0
            return
        if self._clock() >= self._unavailable_until:
            logger.warning(
                "model registry unavailable (%s); keeping the model allow-lists read %.0fs ago",
                type(exc).__name__,
                self._clock() - self._snapshot.loaded_at,
            )
        self._unavailable_until = self._clock() + self._retry_s


def _snapshot(at: float, answer: AccessMap | RegistryView) -> AccessSnapshot:
    if isinstance(answer, RegistryView):
        caps = MappingProxyType(dict(answer.output_caps))
        fallbacks = MappingProxyType(dict(answer.fallbacks))
        return AccessSnapshot(at, _frozen(answer.allowed), caps, fallbacks)
    return AccessSnapshot(at, _frozen(answer))


def _frozen(allowed: AccessMap) -> AccessMap:
    return MappingProxyType(
        {name: None if tenants is None else frozenset(tenants) for name, tenants in allowed.items()}
    )
