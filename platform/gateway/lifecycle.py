"""One request's path through the gateway, from key to usage record.

    authenticate -> resolve model -> (route: parse, tokenize, clamp) -> admit
    (limiter) -> submit (engine) -> events -> close

(gateway.request_flow runs these steps for the generation routes.) What needs the
caller and its model takes the `Authenticated` that resolving the model returns, so it
cannot run before both are known.

`close` is the single exit: it aborts unfinished engine requests (freeing their
KV blocks), settles the limiter, records metrics, ends the span and emits the
usage record. It is idempotent and shielded from cancellation, so it also runs
to completion when the client disconnects mid-stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import anyio
from fastapi import Request
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, use_span

from engine.errors import EngineOverloadedError
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine_hop.client import AdmittedLater, EngineClient
from gateway.access_log import log_access
from gateway.adapters import split_model
from gateway.batch_api.line_call import BATCH_LINE_SCOPE_KEY, BatchLineIdentity
from gateway.errors import ModelNotFoundError, status_of
from gateway.model_access import AccessSnapshot
from gateway.ratelimit_headers import rate_limit_headers
from gateway.request_outcomes import OutcomeTracker
from gateway.state import AppState, client_host
from gateway.tokenize import ModelPrompts
from gateway.tracing import extract_context
from gateway.usage import UsageGuard, UsageRecord
from server.request_ids import (
    REQUEST_ID_HEADER,
    RequestIds,
    current_request_ids,
    valid_client_id,
)
from tenancy.authenticator import check_model
from tenancy.errors import PermissionDeniedError, RateLimitedError
from tenancy.limiter.base import Admission
from tenancy.principal import Principal

logger = logging.getLogger("cloister.gateway")
ENGINE_ERROR = "engine_error"  # the finish reason of a request the engine failed


@dataclass(frozen=True)
class Authenticated:
    """An authenticated caller and the model it may use: what the steps after
    authentication take (`RequestLifecycle.resolve_model` makes one; a move to a
    fallback model makes another)."""

    principal: Principal
    engine: EngineClient  # the engine serving `base_model`
    prompts: ModelPrompts  # prompt encoding with that model's tokenizer
    model: str  # as the request named it (echoed in the response)
    base_model: str  # the served model (`model` less any ":adapter")
    adapter: str | None  # the LoRA adapter the request selected
    # The registry's `max_output_tokens` for the base model (None: its context; no
    # registry, or a model it does not list, caps nothing).
    output_cap: int | None

    @property
    def tenant_id(self) -> str:
        """The caller's tenant."""
        return self.principal.tenant_id


class RequestLifecycle:
    """State and steps of one API request; see the module docstring."""

    def __init__(
        self,
        state: AppState,
        *,
        id_prefix: str,
        headers: Mapping[str, str],
        request_id: str | None = None,
        ids: RequestIds | None = None,
    ) -> None:
        """`request_id`: an id the route minted in its API's own spelling ("resp_...");
        by default one is drawn with `id_prefix`. `ids`: the HTTP request's ids
        (server.request_ids.request_ids_of; by default those of the request being served).
        The request's own id becomes theirs: the response's x-cloister-request-id."""
        self.state = state
        ids = ids or current_request_ids()
        if ids is None:  # no middleware (direct use): the client's id still reaches usage
            ids = RequestIds(
                valid_client_id(headers.get(REQUEST_ID_HEADER)), state.request_ids.next
            )
        self.ids = ids
        self.request_id = ids.assign(request_id or state.request_ids.next(id_prefix))
        self.created = int(time.time())
        self.started = time.monotonic()
        self._operation = "text_completion" if id_prefix == "cmpl" else "chat"
        self.span: Span = state.tracer.start_span(
            "gen_ai.request", context=extract_context(headers), kind=SpanKind.SERVER
        )
        self.span.set_attribute("cloister.request_id", self.request_id)
        if ids.client is not None:
            self.span.set_attribute("cloister.client_request_id", ids.client)
        # The caller, once authenticated (for the audit of denials, the usage record).
        self._principal: Principal | None = None
        self.source: str | None = None
        self.model: str = ""  # as the request named it (echoed in the response)
        self.base_model: str = ""  # the served model (`model` less any ":adapter")
        self.adapter: str | None = None  # the LoRA adapter the request selected
        self.batch = False  # a line of a tenant's batch (the Batch API), metered as such
        self._engine: EngineClient | None = None  # the engine of `model`, once resolved
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.finish_reason: str | None = None
        self.completed = False  # set by the route once the whole response was produced
        # The status an engine failure maps to (None: the engine did not fail this request).
        self.failure_status: int | None = None
        self._admission: Admission | None = None
        self._access: AccessSnapshot | None = None  # the registry's allow-lists, if any
        # The engine's queue refused an interactive request of it at submit (overload).
        self._queue_refused = False
        self._engine_ids: list[str] = []
        self._prompt_lens: dict[str, int] = {}  # engine id -> prompt tokens submitted
        self._processed: set[str] = set()  # engine ids the engine produced a token for
        self._finished_ids: set[str] = set()
        self._cached: dict[str, int] = {}
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._gaps: list[float] = []
        self._queue_s: float | None = None
        self._outcomes = OutcomeTracker()  # for the per-request histograms
        self._usage = UsageGuard(state.usage_sink)
        self._closed = False

    async def caller(self, request: Request) -> Principal:
        """The caller of `request`: its bearer key's principal (from memory; database reads
        happen off the loop; bad credentials are counted and audited by the client's
        address); or, for a line of a tenant's batch that the batch runner sends
        in-process, the principal the runner resolved from the batch's key (an ASGI scope
        entry, which no client can set). A batch line is metered as one and runs in the
        engine's batch traffic class."""
        line = request.scope.get(BATCH_LINE_SCOPE_KEY)
        if isinstance(line, BatchLineIdentity):
            self.batch = True
            self.span.set_attribute("cloister.batch_id", line.batch_id)
            principal = line.principal
        else:
            self.source = client_host(request)
            principal = await self.state.auth.authenticate(
                request.headers.get("authorization"), source=self.source
            )
        self._principal = principal
        # The engine reports KV use by tenant id: metrics label it with this name.
        self.state.metrics.name_tenant(principal.tenant_id, principal.tenant_name)
        if self.state.model_access is not None:
            self._access = await self.state.model_access.current()
        self.span.set_attribute("cloister.tenant_id", principal.tenant_id)
        return principal

    def resolve_model(self, principal: Principal, name: str) -> Authenticated:
        """The caller `principal` with model `name`: 404 for a model not served here, 403
        for one this key, its tenant's limits or the model's registry allow-list do not
        let it use.

        "base:adapter" (a name no engine serves as it is) selects a LoRA adapter of
        `base`: see `_resolve_adapter`."""
        if name not in self.state.engines:
            base, adapter = split_model(name)
            if adapter is not None:
                return self._resolve_adapter(principal, name, base, adapter)
        engine = self.state.engine_for(name)
        self._check_model(principal, name)
        return self._resolved(principal, name, name, engine)

    def _check_model(self, principal: Principal, name: str) -> None:
        try:
            check_model(principal, name)
        except PermissionDeniedError:
            self.state.auth.denied(
                source=self.source, principal=principal, reason="model", resource=name
            )
            raise
        self._check_registry(principal, name)

    def _check_registry(self, principal: Principal, name: str) -> None:
        if self._access is not None and not self._access.allows(name, principal.tenant_id):
            self.state.auth.denied(
                source=self.source, principal=principal, reason="model_tenant", resource=name
            )
            raise PermissionDeniedError(name, f"this tenant may not use model {name!r}")

    def _resolve_adapter(
        self, principal: Principal, name: str, base: str, adapter: str
    ) -> Authenticated:
        """The base model's checks, then the adapter's: the registry must list it (not
        retired) for this tenant (its own or a public one) and the engine must have it
        loaded. Unknown and forbidden are the same 404, so names never leak; both are
        audited."""
        engine = self.state.engine_for(base)
        allowed_names = principal.allowed_models
        if allowed_names is not None and name in allowed_names:
            # A model list that names the adapter itself lets the key use it (only it).
            self._check_registry(principal, base)
        else:
            self._check_model(principal, base)
        access = self._access
        tenant = principal.tenant_id
        # No registry: no owner is known, so no adapter may be used.
        listed = access is not None and name in access.allowed
        allowed = listed and access is not None and access.allows(name, tenant)
        loaded = allowed and any(a.name == adapter for a in engine.adapters())
        if not loaded:
            reason = "adapter_forbidden" if listed and not allowed else "adapter_unknown"
            self.state.auth.denied(
                source=self.source,
                principal=principal,
                reason=reason,
                resource=name,
                outcome="denied:404",
            )
            raise ModelNotFoundError(
                f"the model {name!r} does not exist", param="model", code="model_not_found"
            )
        self.adapter = adapter
        self.state.metrics.adapters.started(model=base, adapter=adapter)
        return self._resolved(principal, name, base, engine)

    def _resolved(
        self, principal: Principal, name: str, base: str, engine: EngineClient
    ) -> Authenticated:
        self.model = name
        self.base_model = base
        self._engine = engine
        self.span.set_attribute("gen_ai.request.model", name)
        return Authenticated(
            principal=principal,
            engine=engine,
            prompts=self.state.tokenize.for_engine(engine),
            model=name,
            base_model=base,
            adapter=self.adapter,
            output_cap=None if self._access is None else self._access.output_caps.get(base),
        )

    async def admit(
        self, call: Authenticated, *, prompt_tokens: int, reserve_tokens: int
    ) -> dict[str, str]:
        """Consumes the caller's limits; returns the x-ratelimit-* headers to send."""
        principal = call.principal
        self.prompt_tokens = prompt_tokens
        if self.batch:
            # A batch line never counts against the interactive RPM/TPM: its tokens were
            # charged to the tenant's batch token budget when the batch was created.
            return {}
        if self._admission is not None:
            # Moved to a fallback model: the first admission stands (limits charged once).
            return rate_limit_headers(self._admission.requests, self._admission.tokens)
        metrics = self.state.metrics
        try:
            admission = await self.state.limits.acquire(
                principal, prompt_tokens=prompt_tokens, max_tokens=reserve_tokens
            )
        except RateLimitedError as exc:
            metrics.observe_rejection(tenant=principal.tenant_name, reason=exc.reason)
            raise
        # Backend failures (fail-open fallbacks, fail-closed refusals) are counted by the
        # limiter itself and exported at scrape time; see routes/metrics.py.
        self._admission = admission
        return rate_limit_headers(admission.requests, admission.tokens)

    @property
    def held_tokens(self) -> int | None:
        """Tokens the limiter admission holds for this request (None: none held)."""
        return None if self._admission is None else self._admission.reserved_tokens

    def overload_fallback(self, call: Authenticated) -> str | None:
        """The model to run this request on instead, once the engine's queue refused it as
        overloaded: its model's registry fallback, when this gateway serves that, this key
        and tenant may use it (as `resolve_model` checks, though unaudited: the caller never
        asked for it), and the refused request was interactive, not a batch line and not
        an adapter's. None otherwise."""
        access, principal = self._access, call.principal
        if not self._queue_refused or self.batch or call.adapter is not None:
            return None
        if access is None:
            return None
        fallback = access.fallbacks.get(self.base_model)
        if fallback is None or fallback not in self.state.engines:
            return None
        try:
            check_model(principal, fallback)
        except PermissionDeniedError:
            return None
        return fallback if access.allows(fallback, principal.tenant_id) else None

    async def move_to(self, call: Authenticated, model: str) -> Authenticated:
        """`call` pointed at served base model `model`, checked by the caller, after
        aborting what the previous engine had queued of it (so engine ids start afresh);
        the limiter admission stays held."""
        await self._abort(self._engine_ids)
        self._engine_ids.clear()
        self._prompt_lens.clear()
        self._outcomes = OutcomeTracker()
        self._queue_refused = False
        return self._resolved(call.principal, model, model, self.state.engine_for(model))

    async def _abort(self, engine_ids: list[str]) -> None:
        """Aborts `engine_ids` on the engine they were submitted to (the last resolved)."""
        engine = self._engine
        if engine is None:  # no model was resolved, so nothing was submitted
            return
        for engine_id in engine_ids:
            try:
                await engine.abort(engine_id)
            except Exception:
                logger.exception("abort failed", extra={"request_id": engine_id})

    def engine_request_id(self, index: int, count: int) -> str:
        """The engine's id for prompt `index` of `count`: the request's id, suffixed if many."""
        return self.request_id if count == 1 else f"{self.request_id}-{index}"

    async def submit(
        self, call: Authenticated, requests: list[EngineRequest]
    ) -> list[AsyncIterator[StreamEvent]]:
        """Queues each engine request on `call`'s engine and returns once the engine admitted each; on a
        refusal, raised here whether the engine runs in this process or behind an engine
        server (`AdmittedLater`), `close` aborts the ones already queued."""
        streams: list[AsyncIterator[StreamEvent]] = []
        later: list[tuple[EngineRequest, AdmittedLater]] = []
        if requests and self.span.is_recording():
            params = requests[0].params
            self.span.set_attribute("gen_ai.request.max_tokens", params.max_tokens or 0)
            self.span.set_attribute("gen_ai.request.temperature", params.temperature)
            self.span.set_attribute("gen_ai.request.top_p", params.top_p)
        # The span is current while the engine takes the requests: a remote client sends
        # its trace context (engine_hop.trace.trace_headers) to the engine server.
        with use_span(self.span, record_exception=False, set_status_on_exception=False):
            for request in requests:
                # Raises InvalidRequestError / EngineOverloadedError with nothing queued for
                # it; `close` aborts the earlier prompts' requests.
                try:
                    stream = call.engine.submit(request)
                except EngineOverloadedError:
                    self._queue_refused = request.traffic_class == "interactive"
                    raise
                streams.append(stream)
                self._engine_ids.append(request.request_id)
                self._prompt_lens[request.request_id] = len(request.prompt_token_ids)
                if isinstance(stream, AdmittedLater):
                    later.append((request, stream))
                else:
                    self._outcomes.submitted(request)
        # All were sent before any is waited for: the engine servers' answers overlap.
        for request, waiting in later:
            try:
                await waiting.admitted()
            except Exception as exc:
                # Nothing of it is queued on the engine: no abort to send for it.
                self._engine_ids.remove(request.request_id)
                del self._prompt_lens[request.request_id]
                if isinstance(exc, EngineOverloadedError):
                    self._queue_refused = request.traffic_class == "interactive"
                raise
            self._outcomes.submitted(request)
        return streams

    async def events(
        self, streams: list[AsyncIterator[StreamEvent]]
    ) -> AsyncIterator[tuple[int, StreamEvent]]:
        """(prompt index, event) pairs from all streams, as they arrive.

        An engine failure is noted (`failure_status`, finish reason "engine_error") before
        it propagates, so the request is recorded as failed whoever catches the error.
        """
        try:
            async for pair in self._events(streams):
                yield pair
        except Exception as exc:
            self.failure_status = status_of(exc)
            self.finish_reason = ENGINE_ERROR
            raise

    async def _events(
        self, streams: list[AsyncIterator[StreamEvent]]
    ) -> AsyncIterator[tuple[int, StreamEvent]]:
        if len(streams) == 1:
            async for event in streams[0]:
                self._observe(event)
                yield 0, event
            return
        queue: asyncio.Queue[tuple[int, StreamEvent | None]] = asyncio.Queue()

        async def pump(i: int, stream: AsyncIterator[StreamEvent]) -> None:
            try:
                async for event in stream:
                    await queue.put((i, event))
            finally:
                await queue.put((i, None))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            live = len(tasks)
            while live:
                i, item = await queue.get()
                if item is None:
                    live -= 1
                    if tasks[i].done() and tasks[i].exception() is not None:
                        raise tasks[i].exception()  # type: ignore[misc]
                    continue
                self._observe(item)
                yield i, item
        finally:
            for task in tasks:
                task.cancel()

    def _observe(self, event: StreamEvent) -> None:
        now = time.monotonic()
        self._outcomes.observe(event)
        new_tokens = sum(len(d.token_ids) for d in event.deltas)
        m = event.metrics
        # The prompt was processed once the engine sampled from it, even a token it hides
        # (an EOS or a stop token carries no ids in the delta).
        if new_tokens or (m is not None and m.first_token_time is not None):
            self._processed.add(event.request_id)
        if new_tokens:
            self.completion_tokens += new_tokens
            if self._first_token_at is None:
                self._first_token_at = now
            elif self._last_token_at is not None:
                self._gaps.append(now - self._last_token_at)
            self._last_token_at = now
        self._cached[event.request_id] = event.num_cached_tokens
        self.cached_tokens = sum(self._cached.values())
        for delta in event.deltas:
            if delta.finish_reason is not None:
                self.finish_reason = delta.finish_reason
        if event.finished:
            self._finished_ids.add(event.request_id)
        if m is not None and m.first_scheduled_time is not None and self._queue_s is None:
            self._queue_s = m.first_scheduled_time - m.arrival_time

    @property
    def billable_prompt_tokens(self) -> int:
        """Prompt tokens of the engine requests the engine actually ran (sampled a token for).

        A request refused before or by the engine (429, 503, 400) ran nothing: zero.
        """
        return sum(self._prompt_lens[i] for i in self._processed if i in self._prompt_lens)

    @property
    def billable_cached_tokens(self) -> int:
        """Cached prompt tokens of the engine requests that ran."""
        return sum(v for i, v in self._cached.items() if i in self._processed)

    async def close_stream(self) -> None:
        """Closes a streamed request: 200 when complete, the engine's failure status when the
        engine failed, else a client disconnect (the stream was cut short)."""
        if self.failure_status is not None:
            await self.close(self.failure_status)
        else:
            await self.close(200, disconnected=not self.completed)

    async def close(self, status: int, *, disconnected: bool = False) -> None:
        """The single exit; idempotent and run to the end even under cancellation."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            await self._close(status, disconnected)

    async def _close(self, status: int, disconnected: bool) -> None:
        state = self.state
        await self._abort([i for i in self._engine_ids if i not in self._finished_ids])
        if disconnected and self.finish_reason is None:
            self.finish_reason = "abort"
        billable_prompt = self.billable_prompt_tokens
        if self._admission is not None:
            # Never blocks: a remote limiter settles in the background. Only what the engine
            # processed is charged: a refused request refunds its whole reservation.
            actual = billable_prompt + self.completion_tokens
            state.limits.release(self._admission, actual_tokens=actual)
        latency = time.monotonic() - self.started
        ttft = None if self._first_token_at is None else self._first_token_at - self.started
        principal = self._principal
        tenant = principal.tenant_name if principal else "anonymous"
        model = self.base_model or self.model
        state.metrics.observe_request(tenant=tenant, status=status, model=model or "none")
        if self.adapter is not None:
            state.metrics.adapters.finished(model=model, adapter=self.adapter)
        if self._engine_ids:
            state.metrics.observe_timings(
                model=model,
                ttft_s=ttft,
                e2e_s=latency,
                queue_s=self._queue_s,
                itl_s=self._gaps,
            )
            state.metrics.observe_outcomes(self._outcomes.outcomes(), model=model)
        self._end_span(status)
        log_access(
            request_id=self.request_id,
            principal=principal,
            model=self.model,
            status=status,
            prompt_tokens=billable_prompt,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.billable_cached_tokens,
            ttft_s=ttft,
            latency_s=latency,
            finish_reason=self.finish_reason,
        )
        if self.batch and status == 499:
            # The batch runner stopped this line (shutdown): the tenant received nothing,
            # and the line runs again, under the same request id, after a restart.
            return
        if principal is not None:
            record = UsageRecord(
                request_id=self.request_id,
                client_request_id=self.ids.client,
                tenant_id=principal.tenant_id,
                key_id=principal.key_id,
                model=model,
                adapter=self.adapter,
                prompt_tokens=billable_prompt,
                cached_tokens=self.billable_cached_tokens,
                completion_tokens=self.completion_tokens,
                ttft_s=ttft,
                latency_s=latency,
                status=status,
                finish_reason=self.finish_reason,
                client_disconnected=disconnected,
                batch=self.batch,
            )
            if self.completed and status == 200:
                # A complete response: durable (fsynced) before its last byte is sent.
                await self._usage.emit_durably(record)
            else:
                self._usage.emit(record)

    def _end_span(self, status: int) -> None:
        span = self.span
        span.set_attribute("gen_ai.operation.name", self._operation)
        span.set_attribute("gen_ai.response.id", self.request_id)
        if self._queue_s is not None:
            span.set_attribute("cloister.engine.queue_time_s", self._queue_s)
        span.set_attribute("gen_ai.system", "cloister")
        span.set_attribute("gen_ai.usage.input_tokens", self.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", self.completion_tokens)
        span.set_attribute("http.response.status_code", status)
        if self.finish_reason:
            span.set_attribute("gen_ai.response.finish_reasons", [self.finish_reason])
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end()
