"""The engine as its own HTTP server: one model, reached only by gateways.

Routes (all but /health and /metrics need the service credential):

    GET  /health                 200 once the engine runs, 503 when it died or drains
    GET  /metrics                vLLM's metric names, for routers and dashboards
    POST /v1/completions         OpenAI completions on token ids or text, streamed or whole
    POST /internal/abort         {"request_id": ...}: stop a request, free its blocks
    PUT  /internal/cache_rules   the registry's per-domain rules and published prefixes
    GET  /internal/info          model name, context length, vocabulary, KV pool, device, dtype
    GET  /internal/stats         load, cumulative cache counters, loaded LoRA adapters
    WS   /internal/link          the gateways' transport: many requests over one
                                 WebSocket, each meaning what its HTTP body means
                                 (engine_server.link)
    PUT, DELETE /internal/adapters/{name}, GET /internal/adapters: LoRA adapters
                                 (engine_server.adapters)

A client that hangs up mid-stream aborts its request, as in-process. Errors are
OpenAI error bodies. With a tracer, each completion records an `engine.generate`
span under the caller's W3C trace context (engine_server.tracing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.trace import Tracer
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from engine.errors import EngineDeadError, InvalidRequestError
from engine.fronts.async_engine import EngineFront, RequestStream
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine_hop.collect import collect, completion_body
from engine_hop.sse import DONE, EventStream, event_chunks, openai_chunk_encoder
from engine_hop.stats_json import spec_decode_to_json, tenant_kv_to_json
from engine_hop.wire import (
    EVENTS_WIRE,
    LINK_PATH,
    REQUEST_ID_HEADER,
    WIRE_HEADER,
    event_to_compact,
    request_from_wire,
    rules_from_wire,
)
from engine_server.adapters import AdapterRoutes
from engine_server.auth import ServiceAuth
from engine_server.link import EngineLink
from engine_server.metrics import EngineMetrics
from engine_server.refusals import (
    BAD_REQUEST,
    NOT_FOUND,
    REFUSED_ERRORS,
    TOO_LARGE,
    UNAUTHORIZED,
    UNAVAILABLE,
    Refused,
    refusal,
    refusal_of,
    refused,
    response_of,
)
from engine_server.tracing import GenerateSpan

MAX_BODY_BYTES = 16 * 1024 * 1024  # a 128k-token prompt of ids is about 1 MiB


def error(status: int, message: str, *, type_: str, code: str | None = None) -> JSONResponse:
    """An OpenAI error body of a status outside the refusal table (a routing error)."""
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


async def _routing_error(_request: Request, exc: Exception) -> Response:
    """A path or method the engine server has no route for, as an OpenAI error (Starlette
    answers these in plain text)."""
    assert isinstance(exc, HTTPException)
    response = error(exc.status_code, str(exc.detail), type_="invalid_request_error")
    response.headers.update(exc.headers or {})
    return response


class EngineServer:
    """The routes over one engine front (an `AsyncEngine` or a `ProcessEngine`)."""

    def __init__(
        self,
        front: EngineFront,
        *,
        model_name: str,
        auth: ServiceAuth,
        tracer: Tracer | None = None,
        device: str | None = None,
        dtype: str | None = None,
        adapter_dir: Path | None = None,
    ) -> None:
        """`tracer`: where the `engine.generate` spans come from (None: no spans);
        `device`, `dtype`: what the engine runs on, for /internal/info (None: not said);
        `adapter_dir`: the folder in which pushed adapters get their own (None: the
        system's temp dir)."""
        self.tracer = tracer
        self.model_name = model_name
        self.auth = auth
        self.draining = False
        self.started = int(time.time())  # the model's `created` in /v1/models
        self.device, self.dtype = device, dtype
        self.metrics = EngineMetrics(front, model_name)
        # Requests naming an adapter are counted as they are submitted (/metrics).
        self.front = front
        self.adapter_routes = AdapterRoutes(front, auth, parent=adapter_dir)
        self.link = EngineLink(self)

    def app(self) -> Starlette:
        """The Starlette app; its lifespan starts and stops the engine."""

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            await self.front.start()
            try:
                yield
            finally:
                self.draining = True
                await self.front.shutdown()
                self.adapter_routes.close()

        return Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/metrics", self.metrics_endpoint, methods=["GET"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/internal/abort", self.abort, methods=["POST"]),
                Route("/internal/cache_rules", self.cache_rules, methods=["PUT"]),
                Route("/internal/info", self.info, methods=["GET"]),
                Route("/internal/stats", self.stats, methods=["GET"]),
                *self.adapter_routes.routes(),
                WebSocketRoute(LINK_PATH, self.link.endpoint),
            ],
            lifespan=lifespan,
            exception_handlers={HTTPException: _routing_error},
        )

    async def drain(self, timeout_s: float) -> None:
        """Admits nothing new, tells linked gateways so, and waits up to `timeout_s` for
        the link's streams to end (HTTP streams are the web server's to wait for)."""
        self.draining = True
        await self.link.announce_draining()
        await self.link.wait_idle(timeout_s)

    async def health(self, _request: Request) -> Response:
        """Ready: the engine runs and takes requests."""
        if self.draining or not self.front.alive:
            return response_of(refusal(UNAVAILABLE, "the engine is not serving"))
        return JSONResponse({"status": "ok", "model": self.model_name})

    async def metrics_endpoint(self, _request: Request) -> Response:
        """Prometheus text exposition."""
        body, content_type = self.metrics.render()
        return Response(body, media_type=content_type)

    async def _json(self, request: Request) -> Any:
        denied = self.auth.check(request.headers.get("authorization"))
        if denied is not None:
            raise refused(UNAUTHORIZED, denied)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            raise refused(TOO_LARGE, "the body is over the size cap")
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise refused(TOO_LARGE, "the body is over the size cap")
        try:
            return orjson.loads(raw or b"{}")
        except orjson.JSONDecodeError:
            raise refused(BAD_REQUEST, "the body is not JSON") from None

    async def completions(self, request: Request) -> Response:
        """Submits one request and streams its events as OpenAI completion chunks.

        A streamed request is submitted by its response, once the route's and the
        framework's own work is done (`EventStream` opens it): submitted here, the engine
        thread's first step would contend for the GIL with that work, which put about
        a fifth of a millisecond on each request's first token (bench/engine_hop.py).
        """
        try:
            body = await self._json(request)
            engine_request = await self.engine_request(body, request.headers)
        except Refused as exc:
            return exc.response
        span = self.span(engine_request, request.headers)
        request_id = engine_request.request_id
        if not body.get("stream", False):  # OpenAI's default is a whole response
            try:
                stream = self.submit(engine_request, span)
            except Refused as exc:
                return exc.response
            try:  # a whole response: the request's events gathered into one body
                collected = await collect(self.events(request_id, stream, span))
            except Exception as exc:  # the request failed in the engine
                return response_of(refusal_of(exc))
            prompt_tokens = len(engine_request.prompt_token_ids)
            whole = completion_body(request_id, self.model_name, prompt_tokens, collected)
            return JSONResponse(whole, headers={REQUEST_ID_HEADER: request_id})
        compact = request.headers.get(WIRE_HEADER) == EVENTS_WIRE
        encode = event_to_compact if compact else openai_chunk_encoder(request_id, self.model_name)

        def open_chunks() -> AsyncGenerator[bytes, None]:
            stream = self.submit(engine_request, span)
            return event_chunks(self.events(request_id, stream, span), encode)

        # The gateway (the compact form) waits on the admission: its 200 goes out at once.
        return EventStream(
            open_chunks, {REQUEST_ID_HEADER: request_id}, last=DONE, announce=compact
        )

    async def engine_request(self, body: Any, headers: Mapping[str, str]) -> EngineRequest:
        """The engine request a completions body and its headers ask for; what this server
        cannot take (another model, a malformed body, draining) raises `Refused`."""
        try:
            if not isinstance(body, dict):
                raise refused(BAD_REQUEST, "the body must be an object")
            if "model" not in body:  # as OpenAI answers a body without one
                message = (
                    f"you must provide a model parameter (this engine serves {self.model_name!r})"
                )
                raise refused(BAD_REQUEST, message)
            if body["model"] != self.model_name:
                message = f"this engine serves {self.model_name!r}, not {body['model']!r}"
                raise refused(NOT_FOUND, message)
            if self.draining:
                raise refused(UNAVAILABLE, "the engine is draining")
            body = await self._with_token_ids(body)
            return request_from_wire(body, headers)
        except InvalidRequestError as exc:
            raise Refused(refusal_of(exc)) from None

    def span(
        self, engine_request: EngineRequest, headers: Mapping[str, str]
    ) -> GenerateSpan | None:
        """The request's `engine.generate` span, under the caller's trace (None: no tracer)."""
        if self.tracer is None:
            return None
        return GenerateSpan(self.tracer, engine_request, headers, self.model_name)

    def submit(self, engine_request: EngineRequest, span: GenerateSpan | None) -> RequestStream:
        """The engine's stream of `engine_request` (counted, if it names an adapter); a
        refusal (a bad request, overload, a dead engine) is a `Refused`, and ends the span."""
        try:
            stream = self.front.submit(engine_request)
        except Exception as exc:
            if span is not None:
                span.end(exc)
            if isinstance(exc, REFUSED_ERRORS):
                raise Refused(refusal_of(exc)) from None
            raise
        self.metrics.adapters.submitted(model=self.model_name, adapter=engine_request.adapter)
        return stream

    async def _with_token_ids(self, body: dict[str, Any]) -> dict[str, Any]:
        """The body with a text prompt tokenized by the engine's tokenizer (a router or a
        client of the Kubernetes inference stack may send text); token ids pass as they are."""
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return body
        if not prompt:
            raise refused(BAD_REQUEST, "the prompt must not be empty", param="prompt")
        ids = await asyncio.to_thread(self.front.tokenizer.encode, prompt)
        extra = dict(body.get("cloister") or {})
        extra.setdefault("prompt_text", prompt)
        return {**body, "prompt": list(ids), "cloister": extra}

    async def events(
        self, request_id: str, stream: AsyncIterator[StreamEvent], span: GenerateSpan | None
    ) -> AsyncGenerator[StreamEvent, None]:
        """The request's events; a request left before its end is aborted (its blocks
        freed at once), and the span ends with the request."""
        finished = False
        failed: Exception | None = None
        try:
            async for event in stream:
                if span is not None:
                    span.observe(event)
                finished = event.finished
                yield event
        except Exception as exc:
            finished, failed = True, exc
            raise
        finally:
            # The client left (or the stream broke) before the end: free its blocks now.
            if not finished:
                with contextlib.suppress(Exception):
                    await self.front.abort(request_id)
            if span is not None:
                span.end(failed, aborted=not finished)

    async def abort(self, request: Request) -> Response:
        """Stops a request; unknown ids are a no-op."""
        try:
            body = await self._json(request)
        except Refused as exc:
            return exc.response
        request_id = body.get("request_id") if isinstance(body, dict) else None
        if not isinstance(request_id, str) or not request_id:
            message = "request_id must be a non-empty string"
            return response_of(refusal(BAD_REQUEST, message, param="request_id"))
        await self.front.abort(request_id)
        return JSONResponse({"aborted": request_id})

    async def cache_rules(self, request: Request) -> Response:
        """Replaces the cache rules; they apply before the engine's next step."""
        try:
            body = await self._json(request)
            if not isinstance(body, dict):
                raise refused(BAD_REQUEST, "the body must be an object")
            rules = rules_from_wire(body)
        except Refused as exc:
            return exc.response
        except InvalidRequestError as exc:
            return response_of(refusal_of(exc))
        try:
            await self.front.update_cache_rules(rules)
        except EngineDeadError as exc:
            return response_of(refusal_of(exc))
        return JSONResponse({"domains": len(rules.domains), "published": len(rules.published)})

    def _unauthorized(self, request: Request) -> Response | None:
        """The 401 of a request without this server's key; None when it may go on."""
        denied = self.auth.check(request.headers.get("authorization"))
        return None if denied is None else response_of(refusal(UNAUTHORIZED, denied))

    async def models(self, request: Request) -> Response:
        """The served model, as OpenAI's model list: what OpenAI clients and serving
        benchmarks ask an endpoint first."""
        if (unauthorized := self._unauthorized(request)) is not None:
            return unauthorized
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self.started,
            "owned_by": "cloister",
            "max_model_len": self.front.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def info(self, request: Request) -> Response:
        """The figures a gateway validates requests against."""
        if (unauthorized := self._unauthorized(request)) is not None:
            return unauthorized
        stats = self.front.stats()
        return JSONResponse(
            {
                "model_name": self.model_name,
                "max_model_len": self.front.max_model_len,
                "vocab_size": self.front.vocab_size,
                "num_blocks": stats.num_blocks,
                "block_size": stats.block_size,
                "device": self.device,
                "dtype": self.dtype,
                "max_loras": int(getattr(stats, "max_loras", 0)),
            }
        )

    async def stats(self, request: Request) -> Response:
        """Load and cumulative counters (what `EngineClient.stats` returns)."""
        if (unauthorized := self._unauthorized(request)) is not None:
            return unauthorized
        s = self.front.stats()
        return JSONResponse(
            {
                "num_running": s.num_running,
                "num_waiting": s.num_waiting,
                "num_batch_running": int(getattr(s, "num_batch_running", 0)),
                "num_batch_waiting": int(getattr(s, "num_batch_waiting", 0)),
                "kv_cache_usage": s.kv_cache_usage,
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "num_preemptions": s.num_preemptions,
                "draining": self.draining,
                # LoRA: slots, sequences per adapter, and what is loaded (the gateway's
                # registry sync compares it with the registry each period).
                "max_loras": int(getattr(s, "max_loras", 0)),
                "lora_running": dict(getattr(s, "lora_running", None) or {}),
                "lora_waiting": dict(getattr(s, "lora_waiting", None) or {}),
                "adapters": self.adapter_routes.listing(),
                "prefill_token_cap": getattr(s, "prefill_token_cap", None),
                # Per fairness key (tenant): KV blocks in use, preemptions suffered, caused.
                "tenant_kv": tenant_kv_to_json(getattr(s, "tenant_kv", None) or {}),
                # The KV tiers under the device pool (engine.kv_cache.host_tier.TierStats).
                "kv_tiers": [dataclasses.asdict(t) for t in getattr(s, "kv_tiers", ())],
                # Speculative decoding's counters (engine.speculative.stats.SpecDecodeStats;
                # null where it is off).
                "spec_decode": spec_decode_to_json(getattr(s, "spec_decode", None)),
                # Overlap scheduling's steps (engine.stats.EngineStats; 0 where it is off).
                "num_overlapped_steps": int(getattr(s, "num_overlapped_steps", 0)),
                "num_synchronous_steps": int(getattr(s, "num_synchronous_steps", 0)),
            }
        )
