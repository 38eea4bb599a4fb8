"""POST /v1/responses, and GET / DELETE /v1/responses/{id} of the caller's tenant.

A response goes the way of a chat completion (authenticate -> resolve model ->
admit -> submit -> events -> close with one usage record): its input, behind the
instructions and the stored conversation of `previous_response_id`, is rendered
with the model's chat template. A finished response is stored for its tenant
(unless `store: false`) with its whole conversation, so the next one can continue it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.errors import InvalidRequestError
from gateway.body import parse_body
from gateway.errors import GatewayError, stream_error_body
from gateway.generation import Submitted, admit_and_submit, collect, settled_on_error
from gateway.generation import stream_response as settling_stream
from gateway.lifecycle import RequestLifecycle
from gateway.response_render import ResponseDraft, ResponseEvents
from gateway.response_store import StoredResponse, Turn
from gateway.responses_input import input_turns, vet_response_request, with_instructions
from gateway.schemas.common import SamplingFields
from gateway.schemas.responses import (
    DeletedResponse,
    ResponseCreateRequest,
    ResponseObject,
    make_response_usage,
)
from gateway.sse import json_model_response
from gateway.state import AppState, app_state, client_host

# Where the shared prompt checks name the prompt, a response names its `input`.
_PROMPT_PARAMS = frozenset({"messages", "prompt"})


class ResponseNotFoundError(GatewayError):
    """No response of that id is stored for this tenant (unknown, expired or another's)."""

    status = 404


@contextmanager
def _prompt_errors_name_input() -> Iterator[None]:
    try:
        yield
    except (InvalidRequestError, GatewayError) as exc:
        if exc.param in _PROMPT_PARAMS:
            exc.param = "input"
        raise


def _sampling(body: ResponseCreateRequest) -> SamplingFields:
    """The sampling fields a response may set; everything else keeps the engine's default."""
    return SamplingFields(
        model=body.model,
        temperature=body.temperature,
        top_p=body.top_p,
        user=body.user,
        cache=body.cache,
        stream=body.stream,
    )


def _previous(state: AppState, tenant_id: str, response_id: str | None) -> tuple[Turn, ...]:
    if response_id is None:
        return ()
    stored = state.responses.get(tenant_id, response_id)
    if stored is None:
        raise ResponseNotFoundError(
            f"previous response with id {response_id!r} not found",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation


def _draft(life: RequestLifecycle, body: ResponseCreateRequest) -> ResponseDraft:
    return ResponseDraft(
        response_id=life.request_id,
        item_id=f"msg_{life.state.request_ids.next()}",
        created_at=life.created,
        model=life.model,
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        previous_response_id=body.previous_response_id,
        store=body.store,
        temperature=body.temperature,
        top_p=body.top_p,
        user=body.user,
        metadata=dict(body.metadata or {}),
    )


def _finish(life: RequestLifecycle, draft: ResponseDraft, text: str) -> ResponseObject:
    usage = make_response_usage(life.prompt_tokens, life.completion_tokens, life.cached_tokens)
    return draft.response(
        text=text, finish_reason=life.finish_reason, usage=usage, completed_at=int(time.time())
    )


def _store(
    life: RequestLifecycle, history: list[Turn], draft: ResponseDraft, final: ResponseObject
) -> None:
    if not draft.store:
        return
    assert life.principal is not None, "authenticate first"
    text = final.output[0].content[0].text
    life.state.responses.put(
        StoredResponse(
            response_id=final.id,
            tenant_id=life.principal.tenant_id,
            conversation=(*history, {"role": "assistant", "content": text}),
            body=final.model_dump_json(),
        )
    )


async def create_response(request: Request) -> Response:
    """Creates a model response; streamed as typed server-sent events with stream=true."""
    state = app_state(request)
    life = RequestLifecycle(
        state,
        id_prefix="resp",
        headers=request.headers,
        request_id=f"resp_{state.request_ids.next()}",
    )
    async with settled_on_error(life):
        principal = await life.authenticate(
            request.headers.get("authorization"), source=client_host(request)
        )
        body = await parse_body(request, ResponseCreateRequest)
        life.resolve_model(body.model)
        vet_response_request(body)
        turns = input_turns(body.input)
        history = [*_previous(state, principal.tenant_id, body.previous_response_id), *turns]
        with _prompt_errors_name_input():
            prompt = await life.prompts.encode_chat(
                principal.tenant_id,
                [dict(t) for t in with_instructions(body.instructions, history)],
            )
            submitted = await admit_and_submit(
                life,
                _sampling(body),
                [prompt],
                requested_max_tokens=body.max_output_tokens,
                max_tokens_param="max_output_tokens",
                logprobs=None,
            )
        draft = _draft(life, body)
        if body.stream:
            return settling_stream(life, _stream(life, history, draft, submitted), submitted)
        choices = await collect(life, submitted, request)
    await life.close(200)
    final = _finish(life, draft, choices[0].text)
    _store(life, history, draft, final)
    return json_model_response(final, headers=submitted.headers)


async def _stream(
    life: RequestLifecycle, history: list[Turn], draft: ResponseDraft, submitted: Submitted
) -> AsyncIterator[bytes]:
    events = ResponseEvents(draft)
    for chunk in events.opening():
        yield chunk
    try:
        async for _, event in life.events(submitted.streams):
            for d in event.deltas:
                if d.text:
                    yield events.delta(d.text)
    except Exception as exc:  # the engine failed mid-stream: tell the client in-band
        yield events.error(stream_error_body(exc, life.request_id))
        return
    life.completed = True
    # Settled (its usage durable) and stored before the client can read the end.
    await life.close_stream()
    final = _finish(life, draft, events.text)
    _store(life, history, draft, final)
    for chunk in events.closing(final):
        yield chunk


def _stored_or_404(request: Request, state: AppState, tenant_id: str) -> StoredResponse:
    response_id = request.path_params["response_id"]
    stored = state.responses.get(tenant_id, response_id)
    if stored is None:
        raise ResponseNotFoundError(
            f"no response with id {response_id!r} found", code="response_not_found"
        )
    return stored


async def retrieve_response(request: Request) -> Response:
    """Returns a stored response of the caller's tenant (404 for any other id)."""
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    stored = _stored_or_404(request, state, principal.tenant_id)
    return Response(stored.body, media_type="application/json")


async def delete_response(request: Request) -> Response:
    """Deletes a stored response of the caller's tenant (404 for any other id)."""
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    stored = _stored_or_404(request, state, principal.tenant_id)
    state.responses.delete(principal.tenant_id, stored.response_id)
    return json_model_response(DeletedResponse(id=stored.response_id))


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
