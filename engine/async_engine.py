"""asyncio front of the engine: a background thread drives `LLMEngine.step()`.

    submit() --inbox--> [engine thread: add/abort, step, step, ...] --events--> RequestStream
    (caller's loop)                                               call_soon_threadsafe

Torch releases the GIL inside its kernels, so the event loop stays responsive
while a step runs. Only the engine thread touches the LLMEngine's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import EngineDeadError, EngineError, EngineOverloadedError
from engine.llm_engine import LLMEngine, StepFailed, build_config
from engine.outputs import StreamEvent
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats

log = logging.getLogger("engine.async")

__all__ = ["AsyncEngine", "EngineStats", "RequestStream"]


class RequestStream:
    """The events of one request, in order; ends after the event with `finished=True`.

    Raises the engine's error if the request failed after it was queued.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue[StreamEvent | BaseException] = asyncio.Queue()
        self._done = False

    def _push(self, item: StreamEvent | BaseException) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item


def _push_all(batch: list[tuple[RequestStream, StreamEvent]]) -> None:
    for stream, event in batch:
        stream._push(event)


@dataclass(frozen=True)
class _Add:
    stream: RequestStream
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_domain: str
    adapter: str | None
    use_cache: bool
    prompt: str | None
    weight: float | None
    max_tokens: int  # what `LLMEngine.validate` returned for these ids and params


@dataclass(frozen=True)
class _Abort:
    request_id: str
    done: asyncio.Future[None]


class AsyncEngine:
    """Streams requests through one `LLMEngine` driven by a background thread."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.vocab_size
        self.model_name = engine.model_name
        self._inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        self._queued = 0  # submitted, not yet seen by the engine thread
        self._lock = threading.Lock()
        self._stats = engine.stats()

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> AsyncEngine:
        """Loads the model and builds the engine from flat options, like `LLM(...)`."""
        return cls(LLMEngine(build_config(model, **options)))

    async def start(self) -> None:
        """Starts the engine thread on the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="cloister-engine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        """Stops the engine thread; live requests end with an error."""
        self._stopping = True
        self._inbox.put(None)
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None

    # -- the caller's side ------------------------------------------------------------

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        cache_domain: str = "default",
        adapter: str | None = None,
        cache: bool = True,
        prompt: str | None = None,
        weight: float | None = None,
    ) -> RequestStream:
        """Queues a request and returns its stream; bad or excess requests raise at once.

        `weight` is the tenant's scheduling share under the fair policy.
        """
        if self._dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        if self._loop is None:
            raise EngineDeadError("the engine was not started; await engine.start() first")
        # Validate our own copy, so that what was checked is exactly what is queued.
        prompt_ids = list(prompt_token_ids)
        max_tokens = self.engine.validate(prompt_ids, params)
        limit = self.engine.config.scheduler.max_waiting
        with self._lock:
            if self._queued + self._stats.num_waiting >= limit:
                raise EngineOverloadedError(f"the waiting queue is full ({limit} requests)")
            self._queued += 1
        request_id = request_id or uuid.uuid4().hex
        stream = RequestStream(request_id)
        self._streams[request_id] = stream
        self._inbox.put(
            _Add(
                stream, prompt_ids, params, cache_domain, adapter, cache, prompt, weight, max_tokens
            )
        )
        self._wake.set()
        return stream

    async def abort(self, request_id: str) -> None:
        """Ends a request; its blocks are free when this returns."""
        if self._loop is None or self._thread is None:
            return
        done: asyncio.Future[None] = self._loop.create_future()
        self._inbox.put(_Abort(request_id, done))
        self._wake.set()
        await done

    def stats(self) -> EngineStats:
        """The counters as of the last step."""
        return self._stats

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_inbox()
                if self.engine.has_unfinished():
                    self._step()
                else:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as exc:  # the loop itself broke: nothing more can be served
            log.exception("engine loop died")
            self._dead = exc
        finally:
            reason = self._dead or EngineDeadError("the engine shut down")
            for stream in list(self._streams.values()):
                self._deliver(stream, EngineDeadError(str(reason)))
            self._streams.clear()

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is None:
                return
            if isinstance(item, _Abort):
                event = self.engine.abort(item.request_id)
                stream = self._streams.pop(item.request_id, None)
                if stream is not None and event is not None:
                    self._deliver(stream, event)
                self._stats = self.engine.stats()
                self._resolve(item.done)
                continue
            with self._lock:
                self._queued -= 1
            try:
                self.engine.add_request(
                    item.prompt_token_ids,
                    item.params,
                    request_id=item.stream.request_id,
                    cache_domain=item.cache_domain,
                    adapter=item.adapter,
                    use_cache=item.use_cache,
                    prompt=item.prompt,
                    weight=item.weight,
                    validated_max_tokens=item.max_tokens,
                )
            except EngineError as exc:
                self._streams.pop(item.stream.request_id, None)
                self._deliver(item.stream, exc)

    def _step(self) -> None:
        try:
            events = self.engine.step()
        except StepFailed as failed:
            log.error("engine step failed", exc_info=failed.__cause__)
            self.engine.fail_requests(sorted(failed.request_ids))
            for request_id in failed.request_ids:
                stream = self._streams.pop(request_id, None)
                if stream is not None:
                    self._deliver(
                        stream, EngineError(f"the engine failed this request: {failed.__cause__}")
                    )
            events = []
        batch: list[tuple[RequestStream, StreamEvent]] = []
        for event in events:
            stream = self._streams.get(event.request_id)
            if stream is None:
                continue
            if event.finished:
                del self._streams[event.request_id]
            batch.append((stream, event))
        self._stats = self.engine.stats()
        if batch:
            # One wake-up of the caller's loop per step, not per request: each
            # cross-thread call costs a syscall and a GIL hand-over.
            assert self._loop is not None
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                self._loop.call_soon_threadsafe(_push_all, batch)

    def _deliver(self, stream: RequestStream, item: StreamEvent | BaseException) -> None:
        assert self._loop is not None
        # A closed caller loop means nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(stream._push, item)

    def _resolve(self, fut: asyncio.Future[None]) -> None:
        assert self._loop is not None

        def settle() -> None:
            if not fut.done():
                fut.set_result(None)

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(settle)
