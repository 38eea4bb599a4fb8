"""POST /v1/chat/completions."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.outputs import CompletionDelta, PositionLogprobs
from gateway.chunk_stream import sse_chunks
from gateway.errors import InvalidParameterError
from gateway.generation import (
    ChoiceState,
    Submitted,
    admit_and_submit,
    choice_index,
    stream_events,
)
from gateway.lifecycle import Authenticated, RequestLifecycle
from gateway.params import vet_extra_fields
from gateway.reasoning import (
    AnswerDelta,
    ReasoningDelta,
    StreamingReasoningSplitter,
    reasoning_enabled,
)
from gateway.request_flow import Generation, GenerationRoute, serve
from gateway.schemas.chat import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    TokenLogprobEntry,
    TopLogprob,
)
from gateway.schemas.common import Usage, make_usage
from gateway.sse import json_model_response
from gateway.tools import StreamingToolParser, render_chat, tool_call_grammar
from gateway.tools.chat_reply import (
    ChatTooling,
    assistant_reply,
    chat_tooling,
    finish_reason,
    stream_deltas,
)


def chat_logprobs(
    positions: list[PositionLogprobs] | tuple[PositionLogprobs, ...],
) -> ChoiceLogprobs:
    """Engine logprobs in the chat shape (token, logprob, bytes, top_logprobs)."""
    return ChoiceLogprobs(
        content=[
            TokenLogprobEntry(
                token=p.chosen.text,
                logprob=p.chosen.logprob,
                bytes=list(p.chosen.text.encode()),
                top_logprobs=[
                    TopLogprob(token=t.text, logprob=t.logprob, bytes=list(t.text.encode()))
                    for t in p.top
                ],
            )
            for p in positions
        ]
    )


def _engine_logprobs(body: ChatCompletionRequest) -> int | None:
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidParameterError("top_logprobs requires logprobs=true", param="top_logprobs")
    if not body.logprobs:
        return None
    return body.top_logprobs or 0


async def _prompt_ids(
    call: Authenticated, body: ChatCompletionRequest, tooling: ChatTooling
) -> list[int]:
    if not body.messages:
        raise InvalidParameterError("messages must not be empty", param="messages")
    rendered = render_chat(
        [m.openai_dict() for m in body.messages],
        tooling.request,
        tooling.parser,
        chat_template=call.prompts.chat_template,
    )
    return await call.prompts.encode_chat(call.tenant_id, rendered.messages, tools=rendered.tools)


_Run = Generation[ChatCompletionRequest, ChatTooling]


class _Chat(GenerationRoute[ChatCompletionRequest, ChatCompletionRequest, ChatTooling]):
    """The chat route's parts of the request skeleton (gateway.request_flow)."""

    id_prefix = "chatcmpl"
    body_type = ChatCompletionRequest

    async def vet(
        self, life: RequestLifecycle, call: Authenticated, body: ChatCompletionRequest
    ) -> ChatCompletionRequest:
        vet_extra_fields(body.extra_fields())
        return body

    async def prepare(
        self, life: RequestLifecycle, call: Authenticated, body: ChatCompletionRequest
    ) -> tuple[ChatTooling, Submitted]:
        tooling = chat_tooling(
            body,
            setting=life.state.settings.gateway.tool_parser,
            chat_template=call.prompts.chat_template,
        )
        if body.max_tokens is not None and body.max_completion_tokens is not None:
            raise InvalidParameterError(
                "give max_tokens or max_completion_tokens, not both", param="max_tokens"
            )
        requested = body.max_completion_tokens or body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        grammar = tool_call_grammar(tooling.request, tooling.parser)
        submitted = await admit_and_submit(
            life,
            call,
            body,
            [await _prompt_ids(call, body, tooling)],
            requested_max_tokens=requested,
            max_tokens_param=param,
            logprobs=_engine_logprobs(body),
            structured=None if grammar is None else (grammar, "tools"),
        )
        return tooling, submitted

    def stream(self, run: _Run) -> AsyncIterator[bytes]:
        return _stream(run, reasoning=_reasoning(run.life, run.call))

    async def respond(self, run: _Run, choices: list[ChoiceState]) -> Response:
        life, body, tooling = run.life, run.vetted, run.prepared
        reasoning = _reasoning(life, run.call)
        replies = [assistant_reply(c.text, tooling, reasoning=reasoning) for c in choices]
        response = ChatCompletion(
            id=life.request_id,
            created=life.created,
            model=life.model,
            choices=[
                ChatChoice(
                    index=c.index,
                    message=message,
                    logprobs=chat_logprobs(c.logprobs) if body.logprobs else None,
                    finish_reason=finish_reason(c.finish_reason, calls, tooling),
                )
                for c, (message, calls) in zip(choices, replies, strict=True)
            ],
            usage=make_usage(life.prompt_tokens, life.completion_tokens, life.cached_tokens),
        )
        return json_model_response(response, headers=run.submitted.headers)


def _reasoning(life: RequestLifecycle, call: Authenticated) -> bool:
    return reasoning_enabled(
        life.state.settings.gateway.reasoning_parser, call.prompts.chat_template
    )


_CHAT = _Chat()


async def create_chat_completion(request: Request) -> Response:
    """Creates a model response for a conversation; streamed as SSE with stream=true."""
    return await serve(_CHAT, request)


def _stream(run: _Run, *, reasoning: bool) -> AsyncIterator[bytes]:
    life = run.life

    def usage_chunk(usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=life.request_id, created=life.created, model=life.model, choices=[], usage=usage
        )

    return sse_chunks(life, run.vetted, _chunks(run, reasoning=reasoning), usage_chunk)


async def _chunks(run: _Run, *, reasoning: bool) -> AsyncGenerator[ChatCompletionChunk, None]:
    """The stream's chunks: each choice's role first, then the engine's deltas (thinking
    and tool calls split out where the request asked for them)."""
    life, body, tooling, submitted = run.life, run.vetted, run.prepared, run.submitted

    def chunk(choices: list[ChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=life.request_id, created=life.created, model=life.model, choices=choices
        )

    total = submitted.n * len(submitted.streams)
    parsers = [tooling.stream_parser() for _ in range(total)] if tooling.active else []
    splitters = [StreamingReasoningSplitter() for _ in range(total)] if reasoning else []
    for index in range(total):
        # A turn that may be only calls has no content yet (null), as OpenAI sends it.
        first = ChunkDelta(role="assistant", content=None if tooling.active else "")
        yield chunk([ChunkChoice(index=index, delta=first)])
    async for prompt_index, event in stream_events(life, submitted):
        for d in event.deltas:
            index = choice_index(prompt_index, d.index, submitted.n)
            if splitters:
                thinking, d = _split_thinking(d, splitters[index])
                for text in thinking:
                    yield chunk(
                        [ChunkChoice(index=index, delta=ChunkDelta(reasoning_content=text))]
                    )
            if parsers:
                for choice in _parsed_choices(body, index, d, parsers[index], tooling):
                    yield chunk([choice])
                continue
            if d.text or d.logprobs:
                logprobs = chat_logprobs(d.logprobs) if body.logprobs and d.logprobs else None
                delta = ChunkDelta(content=d.text)
                yield chunk([ChunkChoice(index=index, delta=delta, logprobs=logprobs)])
            if d.finish_reason is not None:
                done = ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=d.finish_reason)
                yield chunk([done])


def _split_thinking(
    d: CompletionDelta, splitter: StreamingReasoningSplitter
) -> tuple[list[str], CompletionDelta]:
    """(the thinking texts of one engine delta, the delta with only its answer text)."""
    items = splitter.feed(d.text)
    if d.finish_reason is not None:
        items += splitter.finish()
    thinking = [i.text for i in items if isinstance(i, ReasoningDelta)]
    answer = "".join(i.text for i in items if isinstance(i, AnswerDelta))
    return thinking, dataclasses.replace(d, text=answer)


def _parsed_choices(
    body: ChatCompletionRequest,
    index: int,
    d: CompletionDelta,
    parser: StreamingToolParser,
    tooling: ChatTooling,
) -> list[ChunkChoice]:
    """One engine delta of a tool-calling choice as chunk choices; text that may open a
    call waits in `parser`."""
    items = parser.feed(d.text)
    if d.finish_reason is not None:
        items += parser.finish()
    deltas = stream_deltas(items, legacy=tooling.request.legacy)
    logprobs = chat_logprobs(d.logprobs) if body.logprobs and d.logprobs else None
    if logprobs is not None and not deltas:
        deltas = [ChunkDelta(content="")]
    out = [
        ChunkChoice(index=index, delta=delta, logprobs=logprobs if i == 0 else None)
        for i, delta in enumerate(deltas)
    ]
    if d.finish_reason is not None:
        reason = finish_reason(d.finish_reason, parser.calls, tooling)
        out.append(ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=reason))
    return out


# Plain Starlette routes: FastAPI's per-request dependency machinery costs ~60 us for
# nothing here (the body is parsed and validated by hand, see gateway.body).
routes = [Route("/v1/chat/completions", create_chat_completion, methods=["POST"])]
