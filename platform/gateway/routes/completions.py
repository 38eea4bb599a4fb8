"""POST /v1/completions (legacy text completions)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.errors import ContextLengthExceededError
from engine.outputs import PositionLogprobs
from engine_hop.collect import ChoiceState
from gateway.chunk_stream import sse_chunks
from gateway.errors import InvalidParameterError
from gateway.generation import Submitted, admit_and_submit, choice_index, stream_events
from gateway.lifecycle import Authenticated, RequestLifecycle
from gateway.params import vet_extra_fields
from gateway.request_flow import Generation, GenerationRoute, serve
from gateway.schemas.common import Usage, make_usage
from gateway.schemas.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
)
from gateway.sse import json_model_response

MAX_PROMPTS = 64


def completion_logprobs(
    positions: Sequence[PositionLogprobs], offset: int = 0
) -> CompletionLogprobs:
    """Engine logprobs in the legacy shape (parallel lists; text offsets from `offset`)."""
    offsets: list[int] = []
    for p in positions:
        offsets.append(offset)
        offset += len(p.chosen.text)
    return CompletionLogprobs(
        tokens=[p.chosen.text for p in positions],
        token_logprobs=[p.chosen.logprob for p in positions],
        top_logprobs=[{t.text: t.logprob for t in p.top} for p in positions],
        text_offset=offsets,
    )


async def _prompts(call: Authenticated, body: CompletionRequest) -> list[list[int]]:
    """Strings are encoded with the model's special tokens; token id lists are used as given."""
    raw = body.prompt
    tokenize = call.prompts
    vocab = call.engine.vocab_size
    max_model_len = call.engine.max_model_len
    if isinstance(raw, str):
        items: list[str | list[int]] = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        items = [list(raw)]  # type: ignore[arg-type]
    else:
        items = list(raw)  # type: ignore[arg-type]
    if not items or len(items) > MAX_PROMPTS:
        raise InvalidParameterError(f"give 1 to {MAX_PROMPTS} prompts", param="prompt")
    prompts: list[list[int]] = []
    for item in items:
        if isinstance(item, str):
            ids = await tokenize.encode(call.tenant_id, item, param="prompt")
        else:
            ids = list(item)
            if len(ids) >= max_model_len:  # before the per-id scan: it cannot fit anyway
                raise ContextLengthExceededError(
                    f"the prompt has {len(ids)} tokens; this model's context is {max_model_len}",
                    param="prompt",
                )
        if not ids:
            raise InvalidParameterError("a prompt must not be empty", param="prompt")
        if any(not 0 <= t < vocab for t in ids):
            raise InvalidParameterError(
                "prompt token ids must be inside the vocabulary", param="prompt"
            )
        prompts.append(ids)
    return prompts


def _vet_legacy(body: CompletionRequest) -> None:
    if body.echo:
        raise InvalidParameterError("echo is not supported", param="echo", code="unsupported")
    if body.suffix:
        raise InvalidParameterError("suffix is not supported", param="suffix", code="unsupported")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidParameterError("best_of must equal n", param="best_of", code="unsupported")


_Run = Generation[CompletionRequest, None]


class _Completions(GenerationRoute[CompletionRequest, CompletionRequest, None]):
    """The completions route's parts of the request skeleton (gateway.request_flow)."""

    id_prefix = "cmpl"
    body_type = CompletionRequest

    async def vet(
        self, life: RequestLifecycle, call: Authenticated, body: CompletionRequest
    ) -> CompletionRequest:
        vet_extra_fields(body.extra_fields())
        _vet_legacy(body)
        return body

    async def prepare(
        self, life: RequestLifecycle, call: Authenticated, vetted: CompletionRequest
    ) -> tuple[None, Submitted]:
        submitted = await admit_and_submit(
            life,
            call,
            vetted,
            await _prompts(call, vetted),
            requested_max_tokens=vetted.max_tokens,
            max_tokens_param="max_tokens",
            logprobs=vetted.logprobs,
        )
        return None, submitted

    def stream(self, run: _Run) -> AsyncIterator[bytes]:
        return _stream(run.life, run.vetted, run.submitted)

    async def respond(self, run: _Run, choices: list[ChoiceState]) -> Response:
        life, body = run.life, run.vetted
        response = Completion(
            id=life.request_id,
            created=life.created,
            model=life.model,
            choices=[
                CompletionChoice(
                    index=c.index,
                    text=c.text,
                    logprobs=completion_logprobs(c.logprobs) if body.logprobs is not None else None,
                    finish_reason=c.finish_reason,
                )
                for c in choices
            ],
            usage=make_usage(life.prompt_tokens, life.completion_tokens, life.cached_tokens),
        )
        return json_model_response(response, headers=run.submitted.headers)


_COMPLETIONS = _Completions()


async def create_completion(request: Request) -> Response:
    """Completes one or more prompts; streamed as SSE with stream=true."""
    return await serve(_COMPLETIONS, request)


def _stream(
    life: RequestLifecycle, body: CompletionRequest, submitted: Submitted
) -> AsyncIterator[bytes]:
    def usage_chunk(usage: Usage) -> Completion:
        return Completion(
            id=life.request_id, created=life.created, model=life.model, choices=[], usage=usage
        )

    return sse_chunks(life, body, _chunks(life, body, submitted), usage_chunk)


async def _chunks(
    life: RequestLifecycle, body: CompletionRequest, submitted: Submitted
) -> AsyncGenerator[Completion, None]:
    """One chunk per engine delta that carries text, logprobs or a finish reason."""
    offsets = [0] * (submitted.n * len(submitted.streams))
    async for prompt_index, event in stream_events(life, submitted):
        for d in event.deltas:
            index = choice_index(prompt_index, d.index, submitted.n)
            logprobs = None
            if body.logprobs is not None and d.logprobs:
                logprobs = completion_logprobs(d.logprobs, offsets[index])
            offsets[index] += len(d.text)
            if not (d.text or logprobs or d.finish_reason):
                continue
            choice = CompletionChoice(
                index=index, text=d.text, logprobs=logprobs, finish_reason=d.finish_reason
            )
            yield Completion(
                id=life.request_id, created=life.created, model=life.model, choices=[choice]
            )


routes = [Route("/v1/completions", create_completion, methods=["POST"])]
