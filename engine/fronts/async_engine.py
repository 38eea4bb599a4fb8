"""asyncio fronts of the engine: the caller's side of an `EngineLoop`.

    submit() --AddRequest--> [EngineLoop: take inbox, step, ...] --StepReport--> streams
    (caller's loop)                                               one per step

`EngineFront` holds what every front shares: validation before anything is queued,
the bounded waiting queue, one `RequestStream` per request, and the routing of each
`StepReport` on the caller's loop. Where the loop runs is the subclass's business:

  AsyncEngine     on a thread of this process (torch releases the GIL inside its
                  kernels, so the event loop stays responsive while a step runs)
  ProcessEngine   in a child process (engine.fronts.process_engine), so that a busy event
                  loop and the engine never wait for each other's GIL
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from engine.engine_builder import build_config
from engine.errors import AdapterNotFoundError, EngineDeadError, EngineOverloadedError
from engine.fronts.core_loop import (
    STOP,
    AbortRequest,
    AdapterReply,
    AddRequest,
    EngineInfo,
    EngineLoop,
    InboxItem,
    LoadAdapter,
    StepReport,
    UnloadAdapter,
    UpdateCacheRules,
)
from engine.fronts.scratch_thread import run_on_scratch_thread
from engine.kv_cache.cache_rules import CacheRules, DomainRule, match_rule
from engine.llm_engine import LLMEngine
from engine.lora.peft import AdapterInfo
from engine.lora.registry import located
from engine.model.tokenizer import Tokenizer
from engine.outputs import StreamEvent
from engine.queued_stream import QueuedStream
from engine.request import EngineRequest
from engine.scheduler.tenants import within_share
from engine.stats import EngineStats
from engine.structured.compiler import GrammarCompiler
from engine.structured.spec import StructuredSpec
from engine.validation import check_kv_quota, kv_tokens_held

log = logging.getLogger("engine.async")

__all__ = ["AsyncEngine", "EngineFront", "EngineStats", "RequestStream"]


class RequestStream(QueuedStream):
    """The events of one request, in order; ends after the event with `finished=True`.

    Raises the engine's error if the request failed after it was queued.
    """

    def __init__(
        self, request_id: str, prompt: tuple[int, ...] = (), key: str = "", size: int = 1
    ) -> None:
        super().__init__(request_id, prompt)
        self.key = key  # the fairness key, and the sequences it holds (n), for shares
        self.size = size
        self._listener: Callable[[StreamEvent | BaseException], None] | None = None

    def put(self, item: StreamEvent | BaseException) -> None:
        """Hands the item to the listener, if one listens; else queues it for iteration."""
        if self._listener is not None:
            self._listener(item)
        else:
            super().put(item)

    def listen(self, listener: Callable[[StreamEvent | BaseException], None]) -> None:
        """Hands the stream's items to `listener` as they arrive, instead of queueing them
        for iteration: called on the caller's loop, within the engine's report, for each
        event and for the error that ends a failed request.

        For a consumer of many streams (the engine server's link), this saves a task
        wake-up per event; what was already queued is handed over at once. The listener
        must not block or raise.
        """
        self._listener = listener
        while not self._queue.empty():
            listener(self._queue.get_nowait())


class EngineFront(abc.ABC):
    """The caller's side of an engine loop; every method runs on the caller's event loop.

    Subclasses deliver inbox items with `_send` and call `_on_report` / `_on_dead`
    on the caller's loop.
    """

    # False where reports arrive with each event's prompt left out (a whole prompt per
    # request per step is too much to pickle); the stream's own copy is put back.
    events_carry_prompts = True

    def __init__(
        self,
        info: EngineInfo,
        tokenizer: Tokenizer,
        stats: EngineStats,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        self.info = info
        self.tokenizer = tokenizer
        self.model_name = info.model_name
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self._stats = stats
        # Reports carry the per-domain counters only now and then (see EngineLoop):
        # the last ones received, put back into the gauges when `stats()` is asked.
        self._domains = stats.prefix_cache_domains
        self._streams: dict[str, RequestStream] = {}
        # Per fairness key: sequences of its live streams, and its last weight.
        self._live: dict[str, list[float]] = {}
        # The rules with a KV quota, as last pushed: a stream that can never fit is refused
        # before it starts.
        self._quota_rules: dict[str, DomainRule] = {}
        self._aborts: dict[int, asyncio.Future[None]] = {}
        self._abort_tokens = itertools.count()
        # Adapter loads/unloads in flight, and the loaded adapters as last reported.
        self._adapter_calls: dict[int, asyncio.Future[AdapterReply]] = {}
        self._adapters = {a.name: a for a in info.adapters}
        self._after_report: list[Callable[[], None]] = []
        self._num_sent = 0  # AddRequests sent; the loop reports how many it has taken
        self._num_taken = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        # The engine's own compiler when it shares this process; else one of the front's,
        # so that a bad grammar is refused before anything is sent. `is None`, not `or`:
        # a compiler with an empty cache is falsy (it has a length), and a second one
        # would compile every grammar twice, on threads of its own, and never see the
        # engine's refusals of grammars too slow to mask.
        if grammars is None:
            grammars = GrammarCompiler(
                tokenizer,
                vocab_size=info.vocab_size,
                eos_token_ids=sorted(tokenizer.eos_token_ids),
                config=info.structured,
            )
        self.grammars = grammars

    # -- the caller's side ------------------------------------------------------------

    def submit(self, request: EngineRequest) -> RequestStream:
        """Queues a request and returns its stream; bad or excess requests raise at once.

        The request's own fields were checked when it was built; here it is checked
        once against the engine's limits, and nowhere after. Its fairness key (the
        tenant) and weight are whose share of the scheduler and of the waiting slots
        it uses. When the queue looks full, a tenant under its share is still sent on:
        the engine refuses the newest request of the tenant most over its share
        instead, through that request's stream.
        """
        if self._dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        if self._loop is None:
            raise EngineDeadError("the engine was not started; await engine.start() first")
        if not isinstance(request, EngineRequest):
            raise TypeError("submit takes an EngineRequest")
        params, weight = request.params, request.weight
        max_tokens = self.info.validate(request.prompt_token_ids, params)
        quota = match_rule(self._quota_rules, request.fairness_key)
        if quota is not None:
            # Here, so that a stream is refused with a 400 before it starts; the engine
            # checks again against the rules in force when it takes the request.
            num_tokens = len(request.prompt_token_ids) + max_tokens
            held = kv_tokens_held(num_tokens, self.info.window_peak)
            check_kv_quota(held, quota.kv_quota_blocks, self.info.block_size)
        if request.adapter is not None and request.adapter not in self._adapters:
            raise AdapterNotFoundError(
                f"adapter {request.adapter!r} is not loaded", param="adapter"
            )
        key = request.fairness_key
        limit = self.info.max_waiting
        full = self._num_sent - self._num_taken + self._stats.num_waiting >= limit
        if full and not self._within_share(key, params.n, weight):
            raise EngineOverloadedError(f"the waiting queue is full ({limit} requests)")
        request_id = request.request_id
        stream = RequestStream(
            request_id, () if self.events_carry_prompts else request.prompt_token_ids, key, params.n
        )
        self._streams[request_id] = stream
        live = self._live.setdefault(key, [0, 1.0])
        live[0] += params.n
        if weight is not None:
            live[1] = weight
        self._num_sent += 1
        self._send(AddRequest(request, max_tokens))
        return stream

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Compiles `spec` for requests of `cache_domain` (compiled grammars are cached per
        domain) on a worker thread; raises `StructuredSpecError` (a 400) when it is
        invalid, unsupported or over the compile time limit.

        Never blocks the event loop and never touches the engine loop; a request whose
        spec passed here finds its grammar compiled when the engine takes it (in
        process; a child process compiles its own, off its step loop too).
        """
        await self.grammars.prepare(spec, cache_domain)

    def _within_share(self, key: str, n: int, weight: float | None) -> bool:
        """Whether `key`'s live sequences (waiting, running or in transit) leave it under
        its share of the waiting slots, among every key with live sequences.

        A stricter test than the engine's, which counts waiting sequences only: what
        passes here the engine may still refuse, and a key refused here holds at least
        its share of everything live.
        """
        live = self._live.get(key)
        own = weight if weight is not None else (live[1] if live else 1.0)
        total = sum(w for k, (_, w) in self._live.items() if k != key) + own
        return within_share(int(live[0]) if live else 0, n, own, total, self.info.max_waiting)

    def _ended(self, stream: RequestStream) -> None:
        """Takes a stream that ended out of its key's live count."""
        live = self._live.get(stream.key)
        if live is None:
            return
        live[0] -= stream.size
        if live[0] <= 0:
            del self._live[stream.key]

    async def abort(self, request_id: str) -> None:
        """Ends a request; its blocks are free when this returns."""
        if self._loop is None or self._dead is not None or not self._running():
            return
        token = next(self._abort_tokens)
        done: asyncio.Future[None] = self._loop.create_future()
        self._aborts[token] = done
        self._send(AbortRequest(request_id, token))
        await done

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Replaces the engine cache's per-domain rules and pushed published prefixes.

        Returns once the rules are queued to the engine loop (in process mode, once
        sent); the loop applies them before its next step, and so before any request
        submitted after this returns. Raises `EngineDeadError` if the engine is dead.
        """
        if not isinstance(rules, CacheRules):
            raise TypeError(f"update_cache_rules takes CacheRules, not {type(rules).__name__}")
        if self._dead is not None or self._stopping:
            raise EngineDeadError("the engine is not running")
        self._quota_rules = {r: d for r, d in rules.domains if d.kv_quota_blocks is not None}
        self._send(UpdateCacheRules(rules))

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Loads (or replaces) a PEFT LoRA adapter in the engine, between two steps.

        Raises InvalidAdapterError for a folder the model cannot run, AdapterInUseError
        when replacing one that live requests use, EngineDeadError if the engine is dead.
        """
        reply = await self._adapter_call(lambda token: LoadAdapter(name, path, token))
        assert reply.info is not None
        return reply.info

    async def unload_adapter(self, name: str) -> None:
        """Unloads an adapter; AdapterInUseError while requests use it,
        AdapterNotFoundError when it is not loaded."""
        await self._adapter_call(lambda token: UnloadAdapter(name, token))

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters as of the last load or unload, by name, each with where its
        weights were at the last step's report."""
        stats = self._stats
        return [
            located(self._adapters[name], stats.lora_device, stats.lora_host)
            for name in sorted(self._adapters)
        ]

    async def _adapter_call(self, item: Any) -> AdapterReply:
        if self._loop is None or self._dead is not None or self._stopping or not self._running():
            raise EngineDeadError("the engine is not running")
        token = next(self._abort_tokens)
        done: asyncio.Future[AdapterReply] = self._loop.create_future()
        self._adapter_calls[token] = done
        self._send(item(token))
        reply = await done
        if reply.error is not None:
            raise reply.error
        return reply

    def after_each_report(self, callback: Callable[[], None]) -> None:
        """Calls `callback` on the caller's loop once each report's events have reached
        their streams: a listener that batches what it is handed (the engine server's
        link) sends the batch there, while the engine waits for the report to be routed."""
        self._after_report.append(callback)

    def stats(self) -> EngineStats:
        """The counters as of the last report, with the last per-domain counters received."""
        stats = self._stats
        if stats.prefix_cache_domains is self._domains:
            return stats
        # Built here, on the rare scrape, rather than on every report.
        return dataclasses.replace(stats, prefix_cache_domains=self._domains)

    @property
    def alive(self) -> bool:
        """True while the engine loop runs and takes requests."""
        return (
            self._dead is None and not self._stopping and self._loop is not None and self._running()
        )

    # -- for subclasses -----------------------------------------------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Starts the engine loop's side of the front on the running event loop."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stops the engine loop; live requests end with an error."""

    @abc.abstractmethod
    def _send(self, item: InboxItem) -> None:
        """Hands one inbox item to the engine loop, wherever it runs."""

    @abc.abstractmethod
    def _running(self) -> bool:
        """Whether the engine loop was started and has not been shut down."""

    def _on_report(self, report: StepReport) -> None:
        """Routes one report to its streams (on the caller's loop)."""
        self._num_taken = report.num_added
        self._stats = report.stats
        if report.domains_included:
            self._domains = report.stats.prefix_cache_domains
        for reply in report.adapter_replies:
            self._adapters = {a.name: a for a in reply.adapters}
            call = self._adapter_calls.pop(reply.token, None)
            if call is not None and not call.done():
                call.set_result(reply)
        streams = self._streams
        for event in report.events:
            stream = streams.get(event.request_id)
            if stream is None:
                continue
            if event.finished:
                del streams[event.request_id]
                self._ended(stream)
            if not event.prompt_token_ids and stream.prompt:
                event = event.with_prompt(stream.prompt)
            stream.put(event)
        for failure in report.failures:
            failed = streams.pop(failure.request_id, None)
            if failed is not None:
                self._ended(failed)
                failed.put(failure.error)
        for token in report.aborted:
            fut = self._aborts.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        # An aborted request that had no event left (already finished) ends quietly.
        for callback in self._after_report:
            try:
                callback()
            except Exception:  # one callback's bug must not stop the others, or the report
                log.exception("a callback after a report failed")

    def _on_dead(self, reason: BaseException | None) -> None:
        """Ends every live request with an error (on the caller's loop)."""
        if reason is not None and self._dead is None:
            self._dead = reason
        message = str(self._dead or "the engine shut down")
        for stream in self._streams.values():
            stream.put(EngineDeadError(message))
        self._streams.clear()
        self._live.clear()
        for fut in self._aborts.values():
            if not fut.done():
                fut.set_result(None)
        self._aborts.clear()
        for call in self._adapter_calls.values():
            if not call.done():
                call.set_exception(EngineDeadError(message))
        self._adapter_calls.clear()


# How long the engine thread waits, after handing a report to the caller's loop, for the
# loop to route it before it steps on. Where the two threads share a core, the OS keeps
# running the engine thread once it has woken the loop, and the loop, with the tokens it
# would stream, waits out the engine's time slice: in bench/engine_hop.py one request in
# 20 got its first token only when all of its tokens were made (TTFT p95 2.3 ms against
# a p50 of 0.35). Waiting gives the loop the core and the GIL at once; the bound keeps a
# busy loop from holding the engine up by more than this a step.
REPORT_HANDOFF_S = 0.0003


class AsyncEngine(EngineFront):
    """Streams requests through one `LLMEngine` driven by a thread of this process."""

    def __init__(self, engine: LLMEngine, *, report_handoff_s: float = REPORT_HANDOFF_S) -> None:
        """`report_handoff_s`: the longest the engine thread waits after each report for
        the caller's loop to route it (0: it never waits)."""
        if not report_handoff_s >= 0:
            raise ValueError(f"report_handoff_s must be >= 0, not {report_handoff_s!r}")
        super().__init__(EngineInfo.of(engine), engine.tokenizer, engine.stats(), engine.grammars)
        self.engine = engine
        self._core = EngineLoop(engine, self._deliver)
        self._thread: threading.Thread | None = None
        self._handoff_s = report_handoff_s

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> AsyncEngine:
        """Loads the model and builds the engine from flat options, like `LLM(...)`.

        The build runs on a scratch thread, not the caller's: the engine steps on a
        thread of its own, and a second live OpenMP team would slow every step.
        """
        config = build_config(model, **options)
        return cls(run_on_scratch_thread(lambda: LLMEngine(config)))

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
        if self._thread is not None:
            self._core.put(STOP)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        self._on_dead(None)

    def _send(self, item: InboxItem) -> None:
        self._core.put(item)

    def _running(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        try:
            self._core.run()
        except BaseException as exc:  # the loop itself broke: nothing more can be served
            log.exception("engine loop died")
            self._call_on_loop(self._on_dead, exc)
        else:
            self._call_on_loop(self._on_dead, None)

    def _deliver(self, report: StepReport) -> None:
        # One wake-up of the caller's loop per report, not per request: each
        # cross-thread call costs a syscall and a GIL hand-over. Then the engine thread
        # lets the loop route the report before it steps on (`REPORT_HANDOFF_S`).
        assert self._loop is not None
        routed = threading.Lock()
        routed.acquire()
        try:
            self._loop.call_soon_threadsafe(self._route, report, routed)
        except RuntimeError:  # the loop closed: nobody listens
            return
        routed.acquire(timeout=self._handoff_s)

    def _route(self, report: StepReport, routed: threading.Lock) -> None:
        """Routes a report on the caller's loop, then lets the engine thread step on."""
        try:
            self._on_report(report)
        finally:
            routed.release()

    def _call_on_loop(self, fn: Any, arg: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
            self._loop.call_soon_threadsafe(fn, arg)
