"""The loop that drives one `LLMEngine`, fed by an inbox and reporting once per step.

    put(AddRequest | AbortRequest | UpdateCacheRules | LoadAdapter | UnloadAdapter | STOP)
         --inbox--> [run(): take inbox, step, step, ...]
                                                          |
                                         sink(StepReport) once per step or inbox batch

The loop knows nothing of asyncio or processes: `AsyncEngine` runs it on a thread
of the caller's process, `ProcessEngine` in a child process of its own. Only the
thread that calls `run()` touches the LLMEngine's state; `put` may be called from
any thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.config import StructuredConfig
from engine.errors import (
    EngineError,
    InvalidAdapterError,
    RequestAbortedError,
    RequestFailedError,
)
from engine.kv_cache.cache_rules import CacheRules
from engine.llm_engine import LLMEngine
from engine.lora.peft import AdapterInfo
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats
from engine.validation import validate_request

log = logging.getLogger("engine.loop")

# How long an idle loop sleeps before it looks at its inbox again without a wake-up.
IDLE_WAIT_S = 0.5

# How often, at most, a busy loop puts every cache domain's counters in a report:
# the snapshot is O(domains) (one per tenant, key or user), and a ProcessEngine
# pickles it across its pipe. Reports in between carry the cheap gauges only.
DOMAIN_STATS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class EngineInfo:
    """What a front needs to validate and describe requests without the engine itself."""

    model_name: str
    max_model_len: int
    vocab_size: int
    pool_tokens: int
    max_n: int
    max_tokens_limit: int | None
    max_waiting: int
    structured: StructuredConfig = StructuredConfig()
    adapters: tuple[AdapterInfo, ...] = ()  # loaded when the front was built
    block_size: int = 16  # tokens per KV block (a tenant's KV quota is in blocks)
    # The most KV tokens a sequence holds at once on a model with a window on every
    # layer (engine.validation.window_peak_tokens); None: all of its tokens.
    window_peak: int | None = None

    @classmethod
    def of(cls, engine: LLMEngine) -> EngineInfo:
        """The figures of a built engine."""
        sched = engine.config.scheduler
        return cls(
            model_name=engine.model_name,
            max_model_len=engine.max_model_len,
            vocab_size=engine.vocab_size,
            pool_tokens=engine.capacity.num_tokens,
            max_n=sched.max_n,
            max_tokens_limit=sched.max_tokens_limit,
            max_waiting=sched.max_waiting,
            structured=engine.config.structured,
            adapters=tuple(engine.adapters()),
            block_size=engine.capacity.block_size,
            window_peak=engine.window_peak_tokens,
        )

    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> int:
        """Raises a typed error for a bad request; returns its resolved max_tokens.

        The same check as `LLMEngine.validate`, from these figures alone.
        """
        return validate_request(
            prompt_token_ids,
            params,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            pool_tokens=self.pool_tokens,
            max_n=self.max_n,
            max_tokens_limit=self.max_tokens_limit,
            max_waiting=self.max_waiting,
            window_peak=self.window_peak,
        )


@dataclass(frozen=True)
class AddRequest:
    """Queue one validated request (pickled as is to a child process)."""

    request: EngineRequest
    max_tokens: int  # what validation against the engine's limits returned


@dataclass(frozen=True)
class AbortRequest:
    """End one request; `token` comes back in `StepReport.aborted` once it is done."""

    request_id: str
    token: int


@dataclass(frozen=True)
class UpdateCacheRules:
    """Replace the cache's per-domain rules and pushed published prefixes.

    Applied in inbox order, so before the next step and before any request put after it.
    """

    rules: CacheRules


@dataclass(frozen=True)
class LoadAdapter:
    """Load (or replace) a LoRA adapter; the outcome comes back as an `AdapterReply`."""

    name: str
    path: str
    token: int


@dataclass(frozen=True)
class UnloadAdapter:
    """Unload a LoRA adapter; the outcome comes back as an `AdapterReply`."""

    name: str
    token: int


@dataclass(frozen=True)
class AdapterReply:
    """The outcome of a Load/UnloadAdapter, with every adapter loaded after it."""

    token: int
    info: AdapterInfo | None
    error: EngineError | None
    adapters: tuple[AdapterInfo, ...]


class Stop:
    """Ends `EngineLoop.run` (the one instance is `STOP`)."""


STOP = Stop()
InboxItem = AddRequest | AbortRequest | UpdateCacheRules | LoadAdapter | UnloadAdapter | Stop


@dataclass(frozen=True)
class RequestFailure:
    """A request that ended in an error after it was queued."""

    request_id: str
    error: EngineError


@dataclass(frozen=True)
class StepReport:
    """Everything one turn of the loop produced, delivered in one piece.

    Order matters to the receiver: events first (an aborted request's last event
    included), then failures, then the aborts that are complete.
    """

    events: tuple[StreamEvent, ...]
    failures: tuple[RequestFailure, ...]
    aborted: tuple[int, ...]
    num_added: int  # AddRequests taken off the inbox since the loop started
    stats: EngineStats
    # Whether `stats.prefix_cache_domains` is filled in; when False it is left empty and
    # the receiver keeps the last one it got (nothing in it changed, or it is not due).
    domains_included: bool
    adapter_replies: tuple[AdapterReply, ...] = ()


ReportSink = Callable[[StepReport], None]


class EngineLoop:
    """Drives one `LLMEngine`: takes its inbox, steps while work is left, reports."""

    def __init__(self, engine: LLMEngine, sink: ReportSink) -> None:
        self.engine = engine
        self._sink = sink
        self._inbox: queue.SimpleQueue[InboxItem] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._num_added = 0
        # Whether the cache domains may differ from the last report that carried them,
        # and when that report went (None: none yet, so the first report carries them).
        self._domains_changed = False
        self._domains_sent_at: float | None = None
        self._cache_rules: CacheRules | None = None  # the last rules applied
        # Requests waiting for their grammar to compile (off this thread), and those of
        # them aborted meanwhile: each comes back through the inbox once compiled.
        self._compiling: set[str] = set()
        self._aborted_compiling: set[str] = set()
        if engine.overlap is not None:
            engine.overlap.deliver = self._deliver_early

    def _deliver_early(self, events: list[StreamEvent]) -> None:
        """Reports a launched step's events from the overlap host thread while the next
        forward pass runs (engine/overlap.py); this loop's own thread is inside that
        step then, so reports never interleave, nor does anything else touch the state
        read here."""
        domains = self._domains_due(final=False)
        stats = self.engine.stats(domains=domains)
        self._sink(StepReport(tuple(events), (), (), self._num_added, stats, domains))

    def put(self, item: InboxItem) -> None:
        """Hands one item to the loop (any thread)."""
        self._inbox.put(item)
        self._wake.set()

    def run(self) -> None:
        """Serves until `STOP` arrives; an exception here means the engine is dead.
        Either way the engine is closed when it returns."""
        try:
            self._serve()
        finally:
            self.engine.close()

    def _serve(self) -> None:
        while True:
            events: list[StreamEvent] = []
            failures: list[RequestFailure] = []
            aborted: list[int] = []
            replies: list[AdapterReply] = []
            stopping = self._take_inbox(events, failures, aborted, replies)
            if not stopping and self.engine.has_unfinished():
                self._step(events, failures)
                self._domains_changed = True
            idle = not self.engine.has_unfinished()
            # Going idle always reports once more when the domains changed, so that the
            # last report of a burst is exact even if its last step had no events.
            if events or failures or aborted or replies or (idle and self._domains_changed):
                domains = self._domains_due(final=idle or stopping)
                self._sink(
                    StepReport(
                        tuple(events),
                        tuple(failures),
                        tuple(aborted),
                        self._num_added,
                        self.engine.stats(domains=domains),
                        domains,
                        tuple(replies),
                    )
                )
            if stopping:
                return
            if idle:
                self._wake.wait(timeout=IDLE_WAIT_S)
                self._wake.clear()

    def _domains_due(self, *, final: bool) -> bool:
        """Whether this report carries the cache domains; if so, counts them as sent.

        They go in the first report, and after a change when the engine goes idle or
        stops (`final`) or when `DOMAIN_STATS_INTERVAL_S` passed since they last went.
        """
        now = time.monotonic()
        sent_at = self._domains_sent_at
        due = sent_at is None or (
            self._domains_changed and (final or now - sent_at >= DOMAIN_STATS_INTERVAL_S)
        )
        if due:
            self._domains_sent_at = now
            self._domains_changed = False
        return due

    def _take_inbox(
        self,
        events: list[StreamEvent],
        failures: list[RequestFailure],
        aborted: list[int],
        replies: list[AdapterReply] | None = None,
    ) -> bool:
        """Applies every waiting item; True when STOP was among them."""
        if replies is None:
            replies = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return False
            if isinstance(item, Stop):
                return True
            if isinstance(item, AbortRequest):
                if item.request_id in self._compiling:
                    self._aborted_compiling.add(item.request_id)
                event = self.engine.abort(item.request_id)
                if event is not None:
                    events.append(event)
                    self._domains_changed = True
                aborted.append(item.token)
                continue
            if isinstance(item, LoadAdapter | UnloadAdapter):
                replies.append(self._adapter_op(item))
                continue
            if isinstance(item, UpdateCacheRules):
                if item.rules == self._cache_rules:
                    continue  # a periodic push of the same rules: nothing to do or report
                try:
                    self.engine.update_cache_rules(item.rules)
                except (TypeError, ValueError):
                    # The rules are validated where they are built; a bad push must not
                    # take the engine down, and the last good rules stay in force.
                    log.exception("cache rules were refused")
                else:
                    self._cache_rules = item.rules
                    self._domains_changed = True  # a withdrawal may have evicted blocks
                continue
            if self._wait_for_grammar(item):
                continue
            self._num_added += 1
            if item.request.request_id in self._aborted_compiling:
                self._aborted_compiling.discard(item.request.request_id)
                failures.append(RequestFailure(item.request.request_id, RequestAbortedError()))
                continue
            try:
                self.engine.add_request(item.request, validated_max_tokens=item.max_tokens)
            except EngineError as exc:
                failures.append(RequestFailure(item.request.request_id, exc))
            else:
                self._domains_changed = True
                # Requests of a tenant over its share that made room for this one.
                failures.extend(RequestFailure(r, e) for r, e in self.engine.take_refused())

    def _adapter_op(self, item: LoadAdapter | UnloadAdapter) -> AdapterReply:
        """Runs one adapter load or unload between steps; its error goes to the caller."""
        info: AdapterInfo | None = None
        error: EngineError | None = None
        try:
            if isinstance(item, LoadAdapter):
                info = self.engine.load_adapter(item.name, item.path)
            else:
                self.engine.unload_adapter(item.name)
        except EngineError as exc:
            error = exc
        except Exception:  # a broken file must not take the engine down
            log.exception("adapter %r failed to load", item.name)
            error = InvalidAdapterError(f"adapter {item.name!r} could not be read")
        return AdapterReply(item.token, info, error, tuple(self.engine.adapters()))

    def _wait_for_grammar(self, item: AddRequest) -> bool:
        """True when `item` must wait for its grammar; it is put back once compiled.

        Compiling is never done on this thread: a slow grammar would stall every
        request in the batch. A front usually compiled it already (a cache hit here).
        """
        spec = item.request.params.structured
        request_id = item.request.request_id
        if request_id in self._compiling:  # back from its compile
            self._compiling.discard(request_id)
            return False
        domain = item.request.cache_domain
        if spec is None or self.engine.grammars.lookup(spec, domain) is not None:
            return False
        try:
            future = self.engine.grammars.submit(spec, domain)
        except EngineError:
            return False  # too many compiles: add_request refuses it the same way
        self._compiling.add(request_id)
        future.add_done_callback(lambda _: self.put(item))
        return True

    def _step(self, events: list[StreamEvent], failures: list[RequestFailure]) -> None:
        events.extend(self.engine.step())
        # The engine logged each cause with its request id; the owner gets a generic
        # error, because the cause's text may describe other requests or the engine.
        failures.extend(
            RequestFailure(request_id, RequestFailedError())
            for request_id, _ in self.engine.take_failures()
        )
