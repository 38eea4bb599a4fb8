"""`/v1/completions` request, response and stream-chunk bodies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gateway.schemas.common import CompletionEnvelope, SamplingFields, Usage


class CompletionRequest(SamplingFields):
    """The body of POST /v1/completions: one prompt, many prompts, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class CompletionLogprobs(BaseModel):
    """The legacy logprobs block of a text completion."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    """One generated text; `index` runs over prompts times `n`."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None


class Completion(CompletionEnvelope):
    """The non-streaming response, and also the shape of each stream chunk."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
