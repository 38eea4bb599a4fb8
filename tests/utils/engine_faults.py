"""Scripted failures of the real engine front, done by patching its `submit`.

Every helper patches one `AsyncEngine` (or any front with `submit`) in place and
returns a handle whose `undo()` puts the real `submit` back; each is also a context
manager. What is not patched is the real engine answering as it always does.

- `refuse(engine, exc)`: every submit raises `exc` (by default the overload refusal
  the real front raises when its waiting queue is full: a 503).
- `fail_after(engine, n, exc)`: streams run as usual, then raise `exc` after their
  `n`-th event (an engine failure in the middle of a stream).
- `record(engine)`: nothing changes; the handle's `submitted` lists every request
  that reached `submit`, refused or not.
- `record_cache_rules(engine, refuse)`: the real `update_cache_rules`, recorded in
  the returned log (`calls`, and the last rules taken in `cache_rules`); `refuse(n)`
  returns the error the n-th call raises, or None.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from engine.errors import EngineOverloadedError
from engine.kv_cache.cache_rules import CacheRules
from engine.outputs import StreamEvent
from engine.request import EngineRequest


class SubmitPatch:
    """One patch of `engine.submit`; `undo()` (or leaving the `with`) removes it."""

    def __init__(
        self, engine: Any, wrap: Callable[[Callable[[EngineRequest], Any], EngineRequest], Any]
    ) -> None:
        self.engine = engine
        self.submitted: list[EngineRequest] = []
        real = engine.submit

        def submit(request: EngineRequest) -> Any:
            self.submitted.append(request)
            return wrap(real, request)

        engine.submit = submit

    def undo(self) -> None:
        """Restores the real `submit`."""
        self.engine.__dict__.pop("submit", None)

    def __enter__(self) -> SubmitPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def overloaded() -> EngineOverloadedError:
    """The real front's refusal when its waiting queue is full."""
    return EngineOverloadedError("the waiting queue is full (0 requests)", retry_after_s=2.0)


def refuse(engine: Any, exc: Callable[[], BaseException] = overloaded) -> SubmitPatch:
    """Every submit raises `exc()` before anything is queued."""

    def wrap(real: Callable[[EngineRequest], Any], request: EngineRequest) -> Any:
        raise exc()

    return SubmitPatch(engine, wrap)


def fail_after(
    engine: Any, n: int, exc: Callable[[], BaseException] = lambda: RuntimeError("engine failed")
) -> SubmitPatch:
    """Every stream yields its first `n` events, then raises `exc()` (and aborts the
    request in the engine, as the real front does for a request that failed)."""

    def wrap(real: Callable[[EngineRequest], Any], request: EngineRequest) -> Any:
        stream = real(request)

        async def failing() -> AsyncIterator[StreamEvent]:
            produced = 0
            try:
                async for event in stream:
                    if produced >= n:
                        raise exc()
                    produced += 1
                    yield event
            finally:
                await engine.abort(request.request_id)

        return failing()

    return SubmitPatch(engine, wrap)


def record(engine: Any) -> SubmitPatch:
    """Changes nothing; the handle's `submitted` lists every request submitted."""
    return SubmitPatch(engine, lambda real, request: real(request))


class CacheRulesLog:
    """Records what reaches the real front's `update_cache_rules`: every call in `calls`,
    the last rules it took in `cache_rules` (None before any); `refuse(n)` makes the
    `n`-th call (from 1) raise instead, as an engine too busy to take them would."""

    def __init__(self, engine: Any, refuse: Callable[[int], BaseException | None]) -> None:
        self.engine = engine
        self.calls: list[CacheRules] = []
        self.cache_rules: CacheRules | None = None
        real = engine.update_cache_rules

        async def update_cache_rules(rules: CacheRules) -> None:
            self.calls.append(rules)
            exc = refuse(len(self.calls))
            if exc is not None:
                raise exc
            await real(rules)
            self.cache_rules = rules

        engine.update_cache_rules = update_cache_rules


def record_cache_rules(
    engine: Any, refuse: Callable[[int], BaseException | None] = lambda n: None
) -> CacheRulesLog:
    """Patches `engine.update_cache_rules` to record (and, with `refuse`, fail) pushes."""
    return CacheRulesLog(engine, refuse)
