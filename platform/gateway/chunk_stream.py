"""The SSE framing chat and completions streams share around their route's chunks.

A route renders the engine's deltas as chunk models; this sends each one, ends with the
usage chunk when the client asked for it (`stream_options.include_usage`) and `[DONE]`,
and turns an engine failure mid-stream into an in-band error event, as OpenAI does.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing

from pydantic import BaseModel

from gateway.errors import stream_error_body
from gateway.lifecycle import RequestLifecycle
from gateway.schemas.common import SamplingFields, Usage, make_usage
from gateway.sse import DONE, sse_event, sse_model


async def sse_chunks(
    life: RequestLifecycle,
    body: SamplingFields,
    chunks: AsyncGenerator[BaseModel, None],
    usage_chunk: Callable[[Usage], BaseModel],
) -> AsyncIterator[bytes]:
    """`chunks` as SSE events, then `usage_chunk` of the request's usage (only where the
    body asked for usage) and `[DONE]`; `life` is completed once all went out.

    Without `include_usage` the chunks carry no `usage` key at all, as OpenAI sends them.
    """
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    exclude = None if include_usage else {"usage"}
    try:
        # Closed with this stream (a client that left): the route's generator ends, and
        # the engine's requests are aborted, at once rather than when it is collected.
        async with aclosing(chunks):
            async for chunk in chunks:
                yield sse_model(chunk, exclude=exclude)
    except Exception as exc:  # the engine failed mid-stream: tell the client in-band
        yield sse_event(stream_error_body(exc, life.request_id))
        return
    if include_usage:
        usage = make_usage(life.prompt_tokens, life.completion_tokens, life.cached_tokens)
        yield sse_model(usage_chunk(usage))
    life.completed = True
    yield DONE
