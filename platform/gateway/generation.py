"""The steps chat and completions share once the prompt is tokenized.

Clamp max_tokens, build the sampling parameters, consume the limits, derive the
cache domain, submit; and, for non-streaming calls, collect every choice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Response
from starlette.requests import Request

from engine.errors import EngineOverloadedError
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.structured.spec import StructuredSpec, StructuredSpecError
from engine_hop.collect import ChoiceState as ChoiceState  # the routes name it from here
from engine_hop.collect import Collected
from engine_hop.routing import session_hint
from gateway.errors import GatewayError, InvalidParameterError, status_of
from gateway.lifecycle import Authenticated, RequestLifecycle
from gateway.params import (
    build_sampling_params,
    check_request_fits,
    fit_in_flight,
    resolve_max_tokens,
)
from gateway.schemas.common import SamplingFields
from gateway.sse import DONE, SettlingStreamingResponse
from gateway.stream_cadence import Cadence, paced_events
from gateway.structured_output import structured_spec
from tenancy.principal import derive_cache_domain
from tenancy.scopes import tenant_scope

CLIENT_CLOSED = 499  # nginx's "client closed request": no response was sent
T = TypeVar("T")


class ClientDisconnectedError(GatewayError):
    """The client hung up before its (non-streamed) response was ready."""

    status = CLIENT_CLOSED
    type = "client_disconnected"


@dataclass(frozen=True)
class Submitted:
    """Engine streams of an admitted request and the headers to send with its response."""

    streams: list[AsyncIterator[StreamEvent]]
    headers: dict[str, str]
    n: int
    cadence: Cadence | None = None  # the tenant's fixed stream cadence; None: per event


async def admit_and_submit(
    life: RequestLifecycle,
    call: Authenticated,
    body: SamplingFields,
    prompts: list[list[int]],
    *,
    requested_max_tokens: int | None,
    max_tokens_param: str,
    logprobs: int | None,
    structured: tuple[StructuredSpec, str] | None = None,
) -> Submitted:
    """Everything between a tokenized prompt and running engine requests.

    `structured`: a constraint the route derived itself (a strict tool's grammar) and
    the body field to name in its errors; the body's own constraint fields
    (gateway.structured_output) may not ask for another one.
    """
    state = life.state
    principal = call.principal
    max_tokens = resolve_max_tokens(
        requested_max_tokens,
        param=max_tokens_param,
        prompt_tokens=max(len(p) for p in prompts),
        max_model_len=call.engine.max_model_len,
        limits=principal.limits,
        model_cap=call.output_cap,
        model=call.base_model,
    )
    prompt_tokens = sum(len(p) for p in prompts)
    max_tokens = fit_in_flight(
        max_tokens,
        requested=requested_max_tokens,
        param=max_tokens_param,
        prompt_tokens=prompt_tokens,
        sequences=body.n * len(prompts),
        limit=principal.limits.max_tokens_in_flight,
    )
    held = life.held_tokens
    if held is not None:
        # A retry on the fallback model runs under the first admission, which reserved
        # the first try's prompt plus its max_tokens per sequence: no more output than
        # that. A prompt of another length is settled at release, like any request.
        first_try = (held - life.prompt_tokens) // (body.n * len(prompts))
        max_tokens = max(1, min(max_tokens, first_try))
    constraint = structured_spec(body.extra_fields())
    if structured is not None:
        if constraint is not None:
            raise InvalidParameterError(
                f"{constraint[1]} cannot be combined with {structured[1]}", param=constraint[1]
            )
        constraint = structured
    params = build_sampling_params(
        body,
        max_tokens=max_tokens,
        logprobs=logprobs,
        vocab_size=call.engine.vocab_size,
        max_n=state.settings.engine.max_n,
        structured=None if constraint is None else constraint[0],
    )
    check_request_fits(len(prompts), body.n, max_waiting=state.settings.engine.max_waiting)
    domain = derive_cache_domain(principal, body.user)
    if constraint is not None:
        # Compiled before admission: a bad or slow grammar costs the limiter nothing.
        spec, field_name = constraint
        try:
            await call.engine.prepare_structured(spec, domain)
        except StructuredSpecError as exc:
            raise InvalidParameterError(exc.message, param=field_name, code=exc.code) from None
    headers = await life.admit(
        call, prompt_tokens=prompt_tokens, reserve_tokens=max_tokens * body.n * len(prompts)
    )
    # The one place the gateway builds engine requests; each is checked as it is built,
    # all before any is queued. Fairness belongs to the tenant: its keys and users
    # share one share of the engine.
    requests = [
        EngineRequest(
            prompt_token_ids=tuple(prompt),
            params=params,
            request_id=life.engine_request_id(i, len(prompts)),
            cache_domain=domain,
            fairness_key=tenant_scope(principal.tenant_id),
            weight=principal.weight,
            # A never-cache tenant's policy wins over whatever the request asks.
            cache=body.cache and not principal.never_cache,
            session=session_hint(body.user),
            adapter=call.adapter,
            traffic_class="batch" if life.batch or body.service_tier == "flex" else "interactive",
        )
        for i, prompt in enumerate(prompts)
    ]
    cadence = None
    if principal.stream_chunk_tokens is not None:
        # Built before anything is queued: nothing may fail between submit and return.
        cadence = Cadence(
            tokens=principal.stream_chunk_tokens,
            tokenizer=call.prompts.tokenizer,
            stop=params.stop,
            skip_special_tokens=params.skip_special_tokens,
        )
    streams = await life.submit(call, requests)
    return Submitted(streams=streams, headers=headers, n=body.n, cadence=cadence)


def stream_events(
    life: RequestLifecycle, submitted: Submitted
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """The (prompt index, event) pairs a streaming route renders: the engine's events,
    re-chunked to the tenant's stream cadence when it has a fixed one
    (gateway.stream_cadence). Usage is counted on the engine's events, before this."""
    events = life.events(submitted.streams)
    if submitted.cadence is None:
        return events
    return paced_events(events, submitted.cadence)


async def submit_with_fallback(
    life: RequestLifecycle, call: Authenticated, prepare: Callable[[Authenticated], Awaitable[T]]
) -> tuple[Authenticated, T]:
    """Runs `prepare` on `call`, a route's steps that depend on the resolved model (its
    tokenizer and chat template, then `admit_and_submit`), and returns the call it ran on
    and its result.

    When the engine's queue refuses the request as overloaded (at submit in process, or
    at admission on an engine server, engine_hop.remote_client) and its model has a
    fallback the request may use (`RequestLifecycle.overload_fallback`), `prepare` runs
    once more on the fallback: tokenized again by its tokenizer, inside the admission
    already held, so limits are charged once. The response then names the fallback and
    the usage is metered as the fallback's. Should the fallback fail too, for whatever
    reason, the client gets the first refusal (503), as without a fallback.
    """
    try:
        return call, await prepare(call)
    except EngineOverloadedError as refused:
        fallback = life.overload_fallback(call)
        if fallback is None:
            raise
        try:
            moved = await life.move_to(call, fallback)
            result = await prepare(moved)
        except Exception:
            # The refusal and its record name the model asked for.
            await life.move_to(call, call.base_model)
            raise refused from None
    life.span.set_attribute("cloister.fallback_from", call.base_model)
    life.state.metrics.observe_fallback(model=call.base_model, fallback=fallback)
    return moved, result


def choice_index(prompt_index: int, sample_index: int, n: int) -> int:
    """OpenAI numbers choices over prompts times n."""
    return prompt_index * n + sample_index


async def collect(
    life: RequestLifecycle, submitted: Submitted, request: Request | None = None
) -> list[ChoiceState]:
    """Runs every stream to its end and returns the choices in index order.

    With `request`, a client that hangs up first stops the work: the engine requests
    are aborted, the limiter settled (its concurrency slot freed) and the partial usage
    recorded as a disconnect (499); then `ClientDisconnectedError` is raised.
    """
    if request is None:
        return await _collect(life, submitted)
    work = asyncio.ensure_future(_collect(life, submitted))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        gone.cancel()
    if work.cancelled():
        await life.close(CLIENT_CLOSED, disconnected=True)
        raise ClientDisconnectedError("the client closed the connection")
    return work.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body is read: the next message is a disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(life: RequestLifecycle, submitted: Submitted) -> list[ChoiceState]:
    n = submitted.n
    collected = Collected(n * len(submitted.streams))
    async for prompt_index, event in life.events(submitted.streams):
        collected.add(event, first=choice_index(prompt_index, 0, n))
    life.completed = True
    return collected.ordered()


@asynccontextmanager
async def settled_on_error(life: RequestLifecycle) -> AsyncIterator[None]:
    """Closes the request with the status its error maps to (usage, limiter), then re-raises."""
    try:
        yield
    except BaseException as exc:
        await life.close(status_of(exc))
        raise


def stream_response(
    life: RequestLifecycle, chunks: AsyncIterator[bytes], submitted: Submitted
) -> Response:
    """The SSE response; the request is settled when the stream ends or the client leaves."""
    return SettlingStreamingResponse(
        _settled_before_done(life, chunks),
        on_close=life.close_stream,
        headers=submitted.headers,
    )


async def _settled_before_done(
    life: RequestLifecycle, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """`chunks`, with the request closed (its usage durable) before `[DONE]` goes out.

    A client that read the whole stream has a usage record that survives a crash.
    """
    try:
        async for chunk in chunks:
            if chunk == DONE:
                await life.close_stream()
            yield chunk
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
