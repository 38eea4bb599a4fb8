"""From an OpenAI body to engine `SamplingParams`: vet, validate and clamp.

Runs after the prompt is tokenized (the default max_tokens depends on its length)
and before the limiter (which reserves prompt + max_tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import ContextLengthExceededError, InvalidRequestError
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec
from gateway.errors import InvalidParameterError
from gateway.schemas.common import SamplingFields
from tenancy.limits import EffectiveLimits

# Unknown fields that would change the output: refused rather than silently dropped.
_OUTPUT_CHANGING = frozenset(
    {
        "tools",
        "functions",
        "function_call",
        "audio",
        "modalities",
        "prediction",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
        "reasoning_effort",
        "web_search_options",
        "cache_salt",
    }
)


def vet_extra_fields(extra: Mapping[str, Any]) -> None:
    """400 naming the first unknown field that would change the output; others pass."""
    for name, value in extra.items():
        if name not in _OUTPUT_CHANGING or value is None:
            continue
        # Values that ask for the default behaviour are harmless.
        if name == "modalities" and value == ["text"]:
            continue
        if name in ("tools", "functions") and value == []:
            continue
        raise InvalidParameterError(
            f"parameter {name!r} is not supported by this server", param=name, code="unsupported"
        )


def parse_logit_bias(raw: Mapping[str, float] | None, vocab_size: int) -> dict[int, float]:
    """OpenAI's {"token id": bias} map, with ids inside the vocabulary and bias in [-100, 100]."""
    out: dict[int, float] = {}
    for key, bias in (raw or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidParameterError(
                f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
            ) from None
        if not 0 <= token < vocab_size:
            raise InvalidParameterError(
                f"logit_bias token id {token} is outside the vocabulary", param="logit_bias"
            )
        if not -100.0 <= bias <= 100.0:
            raise InvalidParameterError(
                f"logit_bias value for {token} must be in [-100, 100]", param="logit_bias"
            )
        out[token] = float(bias)
    return out


def _prompt_param(max_tokens_param: str) -> str:
    """The body field holding the prompt, for errors about its length."""
    return "messages" if max_tokens_param == "max_completion_tokens" else "prompt"


def resolve_max_tokens(
    requested: int | None,
    *,
    param: str,
    prompt_tokens: int,
    max_model_len: int,
    limits: EffectiveLimits,
    model_cap: int | None = None,
    model: str = "",
) -> int:
    """The output budget: explicit, or what is left of the context, capped by the key's
    (or tenant's) `max_output_tokens` and the model's own (`model_cap`, None: its context).

    A default is clamped to the smallest cap; an explicit value over one is a 400 naming
    the cap that refused it."""
    if limits.max_prompt_tokens is not None and prompt_tokens > limits.max_prompt_tokens:
        raise InvalidParameterError(
            f"the prompt has {prompt_tokens} tokens; this key allows {limits.max_prompt_tokens}",
            param=_prompt_param(param),
            code="prompt_too_long",
        )
    remaining = max_model_len - prompt_tokens
    if remaining < 1:
        raise ContextLengthExceededError(
            f"the prompt has {prompt_tokens} tokens but the model's context is {max_model_len}",
            param=_prompt_param(param),
        )
    caps = [
        (cap, whose)
        for cap, whose in ((limits.max_output_tokens, "this key"), (model_cap, f"model {model!r}"))
        if cap is not None
    ]
    if requested is None:
        return min([remaining, *(cap for cap, _ in caps)])
    if requested < 1:
        raise InvalidParameterError(f"{param} must be at least 1", param=param)
    for cap, whose in caps:
        if requested > cap:
            raise InvalidParameterError(
                f"{param} is {requested}; {whose} allows at most {cap}", param=param
            )
    if requested > remaining:
        raise ContextLengthExceededError(
            f"{prompt_tokens} prompt tokens + {param} {requested} exceed the model's "
            f"context of {max_model_len}",
            param=param,
        )
    return requested


def fit_in_flight(
    max_tokens: int,
    *,
    requested: int | None,
    param: str,
    prompt_tokens: int,
    sequences: int,
    limit: int | None,
) -> int:
    """`max_tokens`, checked against the key's `max_tokens_in_flight` (None: no cap).

    The request holds `prompt_tokens` (all its prompts) + `max_tokens` x `sequences`
    (prompts x n) while it runs. A default `max_tokens` is clamped to what fits; a request
    that cannot fit even with an idle tenant is a 400 naming the limit (never a 429 that
    no retry could pass). Whether it fits beside the tenant's other requests is the
    limiter's call (429 tokens_in_flight).
    """
    if limit is None:
        return max_tokens
    if requested is None:
        fits = (limit - prompt_tokens) // max(1, sequences)
        if fits >= 1:
            return min(max_tokens, fits)
    need = prompt_tokens + max_tokens * sequences
    if need <= limit:
        return max_tokens
    raise InvalidParameterError(
        f"the request would hold {need} tokens in flight ({prompt_tokens} prompt + {param} "
        f"{max_tokens} x {sequences}); this key's max_tokens_in_flight is {limit}",
        param=param if requested is not None else _prompt_param(param),
        code="max_tokens_in_flight_exceeded",
    )


def check_request_fits(num_prompts: int, n: int, *, max_waiting: int) -> None:
    """400 for a request the engine could never take whole, even idle (never a 503).

    Each prompt's `n` samples are one engine sequence each, and the engine's waiting
    queue holds at most `max_waiting` of them: a request that needs more would be
    refused as "overloaded" however long its client waited and retried.
    """
    sequences = num_prompts * n
    if sequences > max_waiting:
        raise InvalidParameterError(
            f"the request needs {sequences} sequences ({num_prompts} prompts x n={n}) but "
            f"the engine can queue at most {max_waiting}; send fewer prompts or a smaller n",
            param="n" if n > 1 else "prompt",
            code="request_too_large",
        )


def _vllm_extras(body: SamplingFields, *, max_tokens: int) -> dict[str, Any]:
    """vLLM's extra parameters the client set, as SamplingParams keywords (ranges: the
    schema and SamplingParams check them)."""
    if body.min_tokens is not None and body.min_tokens > max_tokens:
        raise InvalidParameterError(
            f"min_tokens ({body.min_tokens}) must be at most max_tokens ({max_tokens})",
            param="min_tokens",
        )
    given = {
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "min_tokens": body.min_tokens,
        "ignore_eos": body.ignore_eos,
        "stop_token_ids": None if body.stop_token_ids is None else tuple(body.stop_token_ids),
    }
    return {name: value for name, value in given.items() if value is not None}


def build_sampling_params(
    body: SamplingFields,
    *,
    max_tokens: int,
    logprobs: int | None,
    vocab_size: int,
    max_n: int,
    structured: StructuredSpec | None = None,
) -> SamplingParams:
    """The engine parameters; any range error becomes a 400 naming the parameter."""
    if body.n > max_n:
        raise InvalidParameterError(f"n must be at most {max_n}, got {body.n}", param="n")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise InvalidParameterError("stop takes up to 4 non-empty strings", param="stop")
    try:
        params = SamplingParams(
            n=body.n,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            max_tokens=max_tokens,
            stop=tuple(stop),
            logprobs=logprobs,
            logit_bias=tuple(parse_logit_bias(body.logit_bias, vocab_size).items()),
            **_vllm_extras(body, max_tokens=max_tokens),
            structured=structured,
        )
        params.check_against(vocab_size=vocab_size, max_n=max_n, max_tokens_limit=None)
    except InvalidRequestError as exc:
        raise InvalidParameterError(exc.message, param=exc.param) from None
    return params
