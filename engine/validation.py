"""Checks a request against the engine's limits before anything is queued."""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    KVQuotaExceededError,
    RequestTooLargeError,
)
from engine.sampling_params import SamplingParams


def validate_request(
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    pool_tokens: int,
    max_n: int,
    max_tokens_limit: int | None,
    max_waiting: int | None = None,
    window_peak: int | None = None,
) -> int:
    """Raises a typed error for a request that must not be queued; returns its max_tokens.

    A request is refused at once when it could never finish: a prompt past the
    context, more tokens than the whole KV pool holds at once (`window_peak`: the most
    a sequence holds on a model whose every layer has a window), or more samples than
    the waiting queue holds (it would wait, or be refused as overloaded, forever).
    """
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError("sampling params must be a SamplingParams", param="params")
    if len(prompt_token_ids) == 0:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    # The common case in C: only plain ints, and the smallest and largest in range.
    # Anything else (int subclasses, bools, other types) takes the per-token check,
    # which also names the first bad token.
    if not (
        set(map(type, prompt_token_ids)) == {int}
        and min(prompt_token_ids) >= 0
        and max(prompt_token_ids) < vocab_size
    ):
        _check_each_token(prompt_token_ids, vocab_size)
    params.check_against(vocab_size=vocab_size, max_n=max_n, max_tokens_limit=max_tokens_limit)
    if max_waiting is not None and params.n > max_waiting:
        # Each sample waits as a sequence of its own: more than the queue holds never fit.
        raise RequestTooLargeError(
            f"n={params.n} samples can never fit the waiting queue of {max_waiting} sequences",
            param="n",
        )
    n_prompt = len(prompt_token_ids)
    if n_prompt >= max_model_len:
        raise ContextLengthExceededError(
            f"this model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{n_prompt} tokens and leaves no room for output",
            param="prompt",
        )
    if params.max_tokens is None:
        max_tokens = max_model_len - n_prompt
    else:
        max_tokens = params.max_tokens
        if n_prompt + max_tokens > max_model_len:
            raise ContextLengthExceededError(
                f"this model's maximum context length is {max_model_len} tokens; you asked for "
                f"{n_prompt + max_tokens} ({n_prompt} in the prompt, {max_tokens} to generate)",
                param="max_tokens",
            )
    # The last sampled token is never written to the cache, hence the -1.
    needed = kv_tokens_held(n_prompt + max_tokens - 1, window_peak)
    if needed > pool_tokens:
        raise RequestTooLargeError(
            f"the request needs up to {needed} KV tokens but the whole cache holds {pool_tokens}",
            param="max_tokens",
        )
    return max_tokens


def window_peak_tokens(window: int | None, block_size: int, step_tokens: int) -> int | None:
    """The most KV tokens one sequence holds at once, however long, on a model whose
    every layer has a window of `window` positions (ModelArchitecture.kv_window); None
    without one.

    The blocks behind the window are given back after each step (KVCacheManager.
    release_behind_window), and with overlap scheduling the next step is scheduled
    before the one in flight is taken: a sequence holds its window, two steps of up to
    `step_tokens` each (the most one sequence computes in a step: the token budget, or
    the prefill chunk size when smaller), and a part-filled block at either end.
    """
    if window is None:
        return None
    return (-(-(window + 2 * step_tokens) // block_size) + 1) * block_size


def kv_tokens_held(num_tokens: int, window_peak: int | None) -> int:
    """KV tokens a sequence of `num_tokens` holds at its peak (see `window_peak_tokens`)."""
    return num_tokens if window_peak is None else min(num_tokens, window_peak)


def check_kv_quota(num_tokens: int, quota: int | None, block_size: int) -> None:
    """Refuses a sequence of `num_tokens` (prompt + max_tokens) that could never fit its
    tenant's KV quota of `quota` blocks (None: no quota)."""
    if quota is None:
        return
    need = -(-num_tokens // block_size)
    if need > quota:
        raise KVQuotaExceededError(
            f"this request needs {need} KV blocks for its prompt and max_tokens "
            f"({num_tokens} tokens), more than its tenant's KV quota of {quota} blocks; "
            "lower max_tokens or shorten the prompt",
            param="max_tokens",
        )


def _check_each_token(prompt_token_ids: Sequence[int], vocab_size: int) -> None:
    """Raises for the first token that is not an int id of the vocabulary (bools are not)."""
    for token in prompt_token_ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise InvalidRequestError(
                f"prompt token id {token!r} is outside the vocabulary (0..{vocab_size - 1})",
                param="prompt",
            )
