"""Per-request sampling parameters, validated before a request is queued."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request (the vLLM shape, a subset of it).

    `temperature == 0` means greedy. `seed` makes a sampled request reproducible
    whatever else shares its batch. Stop strings are matched on the detokenized
    text and are not emitted.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per token; 0 = only the chosen token
    skip_special_tokens: bool = True
    logit_bias: tuple[tuple[int, float], ...] = field(default=())

    def __post_init__(self) -> None:
        # Accept lists and dicts from callers but keep the object hashable and frozen.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if isinstance(self.logit_bias, dict):
            object.__setattr__(
                self, "logit_bias", tuple((int(k), float(v)) for k, v in self.logit_bias.items())
            )
        self._check_ranges()

    @property
    def greedy(self) -> bool:
        """True when the request takes the arg-max token at each step."""
        return self.temperature == 0.0

    def _check_ranges(self) -> None:
        def bad(param: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"{param} {why}", param=param)

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n!r}")
        if not _finite(self.temperature) or self.temperature < 0:
            raise bad("temperature", f"must be >= 0, got {self.temperature!r}")
        if not _finite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", f"must be -1, 0 (disabled) or positive, got {self.top_k!r}")
        if not _finite(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2.0 <= value <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {value!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens!r}")
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be >= 0, got {self.min_tokens!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise bad("logprobs", f"must be in [0, 20], got {self.logprobs!r}")
        if any(not s for s in self.stop):
            raise bad("stop", "stop strings must not be empty")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad("seed", f"must be an integer, got {self.seed!r}")
        for token, bias in self.logit_bias:
            if not _finite(bias) or not -100.0 <= bias <= 100.0:
                raise bad("logit_bias", f"bias for token {token} must be in [-100, 100]")

    def check_against(self, *, vocab_size: int, max_n: int, max_tokens_limit: int | None) -> None:
        """Checks the limits that depend on the engine, not on the parameters alone."""
        if self.n > max_n:
            raise InvalidRequestError(f"n must be at most {max_n}, got {self.n}", param="n")
        if max_tokens_limit is not None and (self.max_tokens or 0) > max_tokens_limit:
            raise InvalidRequestError(
                f"max_tokens must be at most {max_tokens_limit}, got {self.max_tokens}",
                param="max_tokens",
            )
        for token in self.stop_token_ids:
            if not 0 <= token < vocab_size:
                raise InvalidRequestError(
                    f"stop token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                    param="stop_token_ids",
                )
        for token, _ in self.logit_bias:
            if not 0 <= token < vocab_size:
                raise InvalidRequestError(
                    f"logit_bias token id {token} is outside the vocabulary (0..{vocab_size - 1})",
                    param="logit_bias",
                )


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
