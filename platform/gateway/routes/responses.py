"""POST /v1/responses, and GET / DELETE /v1/responses/{id} of the caller's tenant.

A response goes the way of a chat completion (authenticate -> resolve model ->
admit -> submit -> events -> close with one usage record): its input, behind the
instructions and the stored conversation of `previous_response_id`, is rendered
with the model's chat template, its function tools declared as chat declares them
(gateway.tools), and the calls the model writes come back as `function_call` items.
A finished response is stored for its tenant (unless `store: false`) with its whole
conversation, so the next one can continue it.

A stored record is bounded (`responses_max_record_bytes`, gateway.response_store): what
is known before generation (the conversation so far, instructions, tools, tool_choice,
metadata) is checked first, and a request over the bound is a 400 naming its largest
field before anything is admitted or generated. The output is known only at the end: a
response whose record it pushes over the bound, or that the store refuses for any other
reason, is returned with `store: false` (in a stream, the final `response.completed` or
`response.incomplete` event says so; the opening events echo the request). `store: true`
always means the response can be read back.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.errors import InvalidRequestError
from gateway.errors import GatewayError, InvalidParameterError, stream_error_body
from gateway.generation import ChoiceState, Submitted, admit_and_submit, stream_events
from gateway.lifecycle import Authenticated, RequestLifecycle
from gateway.request_flow import Generation, GenerationRoute, serve
from gateway.response_render import ResponseDraft, ResponseEvents
from gateway.response_store import StoredResponse, Turn, record_json
from gateway.responses_input import input_turns, vet_response_request, with_instructions
from gateway.schemas.common import SamplingFields
from gateway.schemas.responses import (
    DeletedResponse,
    FunctionCallItem,
    ResponseCreateRequest,
    ResponseObject,
    make_response_usage,
)
from gateway.sse import json_model_response
from gateway.state import AppState, app_state, client_host
from gateway.tools import (
    ContentDelta,
    ToolCallArguments,
    ToolCallStart,
    choose_parser,
    new_call_id,
    parse_tool_calls,
    render_chat,
    resolve_tools,
    tool_call_grammar,
)
from gateway.tools.chat_reply import ChatTooling

# Where the shared prompt checks name the prompt, a response names its `input`.
_PROMPT_PARAMS = frozenset({"messages", "prompt"})


class StoredResponseTooLargeError(InvalidParameterError):
    """The response to store would be larger than one stored record may be (400)."""


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
        service_tier=body.service_tier,
        stream=body.stream,
    )


async def _previous(state: AppState, tenant_id: str, response_id: str | None) -> tuple[Turn, ...]:
    if response_id is None:
        return ()
    stored = await state.responses.get(tenant_id, response_id)
    if stored is None:
        raise ResponseNotFoundError(
            f"previous response with id {response_id!r} not found",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.conversation


def _tooling(
    life: RequestLifecycle, call: Authenticated, body: ResponseCreateRequest
) -> ChatTooling:
    """The request's function tools (the Responses API's flat shape) and the call format."""
    request = resolve_tools(
        tools=body.tools or None,
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        flat=True,
    )
    parser = choose_parser(life.state.settings.gateway.tool_parser, call.prompts.chat_template)
    if request.active and parser == "none":
        raise InvalidParameterError(
            "tool calling is not enabled for this model", param="tools", code="unsupported"
        )
    return ChatTooling(request, parser)


def _split(text: str, tooling: ChatTooling) -> tuple[str, list[FunctionCallItem]]:
    """A finished text as the message's text and the calls it makes."""
    if not tooling.active:
        return text, []
    parsed = parse_tool_calls(
        text, tooling.parser, names=tooling.request.names, parallel=tooling.request.parallel
    )
    calls = []
    for call in parsed.calls:
        call_id = new_call_id()
        calls.append(
            FunctionCallItem(
                id=f"fc_{call_id.removeprefix('call_')}",
                call_id=call_id,
                name=call.name,
                arguments=call.arguments,
            )
        )
    return parsed.content or "", calls


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
        tools=tuple(body.tools or ()),
        tool_choice=body.tool_choice if body.tool_choice is not None else "auto",
        parallel_tool_calls=body.parallel_tool_calls is not False,
    )


def _finish(
    life: RequestLifecycle, draft: ResponseDraft, text: str, calls: list[FunctionCallItem]
) -> ResponseObject:
    usage = make_response_usage(life.prompt_tokens, life.completion_tokens, life.cached_tokens)
    return draft.response(
        text=text,
        finish_reason=life.finish_reason,
        usage=usage,
        completed_at=int(time.time()),
        calls=calls,
    )


def _assistant_turn(final: ResponseObject) -> Turn:
    """The response's output as the assistant turn a later response continues from."""
    text = "".join(
        part.text for item in final.output if item.type == "message" for part in item.content
    )
    calls = [
        {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        for item in final.output
        if item.type == "function_call"
    ]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _check_record_size(
    life: RequestLifecycle,
    body: ResponseCreateRequest,
    previous: Sequence[Turn],
    turns: Sequence[Turn],
    draft: ResponseDraft,
) -> None:
    """400 before generation when the record to store would pass the bound without any
    output yet, naming the largest field (the stored conversation counts as
    `previous_response_id`)."""
    limit = life.state.settings.responses.max_record_bytes
    size = len(record_json((*previous, *turns), draft.response(text=None).model_dump_json()))
    if size <= limit:
        return
    fields: dict[str, object] = {
        "input": list(turns),
        "previous_response_id": list(previous),
        "instructions": body.instructions,
        "tools": body.tools,
        "tool_choice": body.tool_choice,
        "metadata": body.metadata,
    }
    sizes = {name: len(json.dumps(value)) for name, value in fields.items()}
    param = max(sizes, key=lambda name: sizes[name])
    raise StoredResponseTooLargeError(
        f"a stored response is at most {limit} bytes, and this one would be {size} before "
        f"any output ({param}: {sizes[param]} bytes); shorten {param}, or send store: false",
        param=param,
        code="stored_response_too_large",
    )


async def _store(
    life: RequestLifecycle,
    call: Authenticated,
    history: list[Turn],
    draft: ResponseDraft,
    final: ResponseObject,
) -> ResponseObject:
    """Stores `final` when asked to; what to answer: `final`, or it with `store: false`
    when it was not stored (too large with its output, the tenant's or the store's caps,
    the store unavailable)."""
    if not draft.store:
        return final
    stored = await life.state.responses.put(
        StoredResponse(
            response_id=final.id,
            tenant_id=call.tenant_id,
            conversation=(*history, _assistant_turn(final)),
            body=final.model_dump_json(),
        )
    )
    return final if stored else final.model_copy(update={"store": False})


@dataclass(frozen=True)
class _Vetted:
    """A response request that passed its checks, with the conversation it continues."""

    body: ResponseCreateRequest
    previous: tuple[Turn, ...]  # the stored conversation of `previous_response_id`
    turns: list[Turn]  # its own input

    @property
    def history(self) -> list[Turn]:
        """The whole conversation so far, as stored with the response."""
        return [*self.previous, *self.turns]


_Prepared = tuple[ChatTooling, ResponseDraft]  # the model's tool format; the response
_Run = Generation[_Vetted, _Prepared]


class _Responses(GenerationRoute[ResponseCreateRequest, _Vetted, _Prepared]):
    """The responses route's parts of the request skeleton (gateway.request_flow)."""

    id_prefix = "resp"
    body_type = ResponseCreateRequest

    def lifecycle(self, request: Request) -> RequestLifecycle:
        state = app_state(request)
        return RequestLifecycle(
            state,
            id_prefix=self.id_prefix,
            headers=request.headers,
            request_id=f"resp_{state.request_ids.next()}",
        )

    async def vet(
        self, life: RequestLifecycle, call: Authenticated, body: ResponseCreateRequest
    ) -> _Vetted:
        vet_response_request(body)
        _tooling(life, call, body)  # tools the model cannot call are refused before the input
        turns = input_turns(body.input)
        previous = await _previous(life.state, call.tenant_id, body.previous_response_id)
        return _Vetted(body, previous, turns)

    async def prepare(
        self, life: RequestLifecycle, call: Authenticated, vetted: _Vetted
    ) -> tuple[_Prepared, Submitted]:
        """The steps that depend on the resolved model (its name in the response, its chat
        template and tokenizer): run again on a fallback model
        (gateway.generation.submit_with_fallback)."""
        body, previous, turns = vetted.body, vetted.previous, vetted.turns
        tooling = _tooling(life, call, body)
        draft = _draft(life, body)
        if draft.store:
            _check_record_size(life, body, previous, turns, draft)
        with _prompt_errors_name_input():
            rendered = render_chat(
                [dict(t) for t in with_instructions(body.instructions, [*previous, *turns])],
                tooling.request,
                tooling.parser,
                chat_template=call.prompts.chat_template,
            )
            prompt = await call.prompts.encode_chat(
                call.tenant_id, rendered.messages, tools=rendered.tools
            )
            grammar = tool_call_grammar(tooling.request, tooling.parser)
            submitted = await admit_and_submit(
                life,
                call,
                _sampling(body),
                [prompt],
                requested_max_tokens=body.max_output_tokens,
                max_tokens_param="max_output_tokens",
                logprobs=None,
                structured=None if grammar is None else (grammar, "tools"),
            )
        return (tooling, draft), submitted

    async def stream(self, run: _Run) -> AsyncIterator[bytes]:
        life, (tooling, draft), submitted = run.life, run.prepared, run.submitted
        events = ResponseEvents(draft)
        parser = tooling.stream_parser() if tooling.active else None
        for chunk in events.opening(message=parser is None):
            yield chunk
        try:
            async for _, event in stream_events(life, submitted):
                for d in event.deltas:
                    if not d.text and d.finish_reason is None:
                        continue
                    if parser is None:
                        for chunk in events.delta(d.text) if d.text else []:
                            yield chunk
                        continue
                    items = parser.feed(d.text) if d.text else []
                    if d.finish_reason is not None:
                        items += parser.finish()
                    for item in items:
                        for chunk in _item_events(events, item):
                            yield chunk
        except Exception as exc:  # the engine failed mid-stream: tell the client in-band
            yield events.error(stream_error_body(exc, life.request_id))
            return
        life.completed = True
        # Settled (its usage durable) and stored before the client can read the end.
        await life.close_stream()
        final = _finish(life, draft, events.text, events.calls)
        final = await _store(life, run.call, run.vetted.history, draft, final)
        for chunk in events.closing(final):
            yield chunk

    async def respond(self, run: _Run, choices: list[ChoiceState]) -> Response:
        life, (tooling, draft) = run.life, run.prepared
        final = _finish(life, draft, *_split(choices[0].text, tooling))
        final = await _store(life, run.call, run.vetted.history, draft, final)
        return json_model_response(final, headers=run.submitted.headers)


_RESPONSES = _Responses()


async def create_response(request: Request) -> Response:
    """Creates a model response; streamed as typed server-sent events with stream=true."""
    return await serve(_RESPONSES, request)


def _item_events(events: ResponseEvents, item: object) -> list[bytes]:
    """The stream events of one item the tool parser found."""
    if isinstance(item, ContentDelta):
        return events.delta(item.text) if item.text else []
    if isinstance(item, ToolCallStart):
        return events.call_started(item.index, item.id, item.name)
    if isinstance(item, ToolCallArguments):
        return events.call_arguments(item.index, item.arguments)
    return []


async def _stored_or_404(request: Request, state: AppState, tenant_id: str) -> StoredResponse:
    response_id = request.path_params["response_id"]
    stored = await state.responses.get(tenant_id, response_id)
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
    stored = await _stored_or_404(request, state, principal.tenant_id)
    return Response(stored.body, media_type="application/json")


async def delete_response(request: Request) -> Response:
    """Deletes a stored response of the caller's tenant (404 for any other id)."""
    state = app_state(request)
    principal = await state.auth.authenticate(
        request.headers.get("authorization"), source=client_host(request)
    )
    stored = await _stored_or_404(request, state, principal.tenant_id)
    await state.responses.delete(principal.tenant_id, stored.response_id)
    return json_model_response(DeletedResponse(id=stored.response_id))


routes = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
