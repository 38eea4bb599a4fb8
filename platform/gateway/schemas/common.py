"""Fields shared by the chat and completions bodies, and the usage block."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from engine.sampling_params import MAX_STOP_TOKEN_IDS, REPETITION_PENALTY_RANGE

# The smallest top_p accepted: far above float32's underflow, and any top_p this
# small already keeps only the top token.
MIN_TOP_P = 1e-8


class StreamOptions(BaseModel):
    """`stream_options`: only `include_usage` changes what we send."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Parameters both endpoints accept. Unknown fields are kept so they can be vetted."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    # A top_p that rounds to 0 in float32 (1e-300) crashed the sampler; below
    # MIN_TOP_P it means nothing a client could want, so it is refused.
    top_p: float | None = Field(default=None, ge=MIN_TOP_P, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    # vLLM's extra sampling parameters (not in OpenAI's API); None: the engine default.
    top_k: StrictInt | None = Field(default=None, ge=-1, description="-1 or 0: disabled")
    min_p: StrictFloat | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: StrictFloat | None = Field(
        default=None, ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1]
    )
    min_tokens: StrictInt | None = Field(default=None, ge=0, description="At most max_tokens")
    ignore_eos: StrictBool | None = Field(
        default=None, description="Go on past EOS; max_tokens and the key's caps still apply"
    )
    stop_token_ids: list[StrictInt] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS)
    user: str | None = Field(default=None, max_length=256)
    # SECURITY.md: `cache: false` neither reads nor writes the prefix cache.
    cache: StrictBool = True
    # OpenAI's service tier: "flex" is batch work (engine/scheduler/traffic.py), run in
    # the capacity interactive requests leave; the others are interactive.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    def extra_fields(self) -> dict[str, Any]:
        """Fields the client sent that this schema does not name."""
        return dict(self.model_extra or {})


class PromptTokensDetails(BaseModel):
    """How much of the prompt came out of the prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token counts of one request, summed over all its choices."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionEnvelope(BaseModel):
    """What a chat or text completion, and each of their stream chunks, carries before
    its choices. Each kind narrows `object` to its own literal and adds its choices, usage
    and fingerprint after these (pydantic keeps a narrowed field in its place, so the
    fields stay in OpenAI's order)."""

    id: str
    object: str
    created: int
    model: str


def make_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    """Builds a `Usage` whose total is always the sum of its parts."""
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


class ErrorDetail(BaseModel):
    """The inside of an OpenAI error body."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """`{"error": {...}}` as OpenAI sends it."""

    error: ErrorDetail
