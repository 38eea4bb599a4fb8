"""Per-request sampling parameters, validated before a request is queued."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredSpec

# Below this temperature a request is greedy (vLLM's _SAMPLING_EPS): logits divided by
# it would overflow float32.
GREEDY_BELOW = 1e-5
# Far above any useful temperature (OpenAI's API stops at 2); keeps logits / T finite.
MAX_TEMPERATURE = 100.0
# A penalty of 1e-300 would divide logits by zero once it is a float32.
REPETITION_PENALTY_RANGE = (0.01, 100.0)
# Stop strings are matched on the text after every token: bounded so matching stays cheap.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
# Bias and stop-token entries are applied on every step: bounded so that one request's
# list cannot slow down the steps it shares with others.
MAX_LOGIT_BIAS = 1024
MAX_STOP_TOKEN_IDS = 1024
# OpenAI's seed is an int64; unsigned 64-bit seeds (NumPy style) are accepted as well.
SEED_MIN = -(1 << 63)
SEED_END = 1 << 64


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
    structured: StructuredSpec | None = None  # what the output must match (constrained decoding)

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
        """True when the request takes the arg-max token at each step.

        A temperature below `GREEDY_BELOW` means greedy, as in vLLM: dividing logits
        by it would overflow float32 and sample garbage.
        """
        return self.temperature < GREEDY_BELOW

    def _check_ranges(self) -> None:
        def bad(param: str, why: str) -> InvalidRequestError:
            return InvalidRequestError(f"{param} {why}", param=param)

        if not _integer(self.n) or self.n < 1:
            raise bad("n", f"must be at least 1, got {self.n!r}")
        if not _finite(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise bad(
                "temperature", f"must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}"
            )
        if not _finite(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not _integer(self.top_k) or self.top_k < -1:
            raise bad("top_k", f"must be -1, 0 (disabled) or positive, got {self.top_k!r}")
        if not _finite(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2.0 <= value <= 2.0:
                raise bad(name, f"must be in [-2, 2], got {value!r}")
        low, high = REPETITION_PENALTY_RANGE
        if not _finite(self.repetition_penalty) or not low <= self.repetition_penalty <= high:
            raise bad(
                "repetition_penalty",
                f"must be in [{low:g}, {high:g}], got {self.repetition_penalty!r}",
            )
        if self.max_tokens is not None and (not _integer(self.max_tokens) or self.max_tokens < 1):
            raise bad("max_tokens", f"must be at least 1, got {self.max_tokens!r}")
        if not _integer(self.min_tokens) or self.min_tokens < 0:
            raise bad("min_tokens", f"must be >= 0, got {self.min_tokens!r}")
        if self.logprobs is not None and (
            not _integer(self.logprobs) or not 0 <= self.logprobs <= 20
        ):
            raise bad("logprobs", f"must be in [0, 20], got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "stop strings must be non-empty strings")
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise bad(
                "stop",
                f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} characters",
            )
        if self.seed is not None and (
            not _integer(self.seed) or not SEED_MIN <= self.seed < SEED_END
        ):
            raise bad("seed", f"must be a 64-bit integer, got {self.seed!r}")
        if self.structured is not None and not isinstance(self.structured, StructuredSpec):
            raise bad("structured", "must be a StructuredSpec")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise bad("logit_bias", f"takes at most {MAX_LOGIT_BIAS} entries")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise bad("stop_token_ids", f"takes at most {MAX_STOP_TOKEN_IDS} ids")
        for token, bias in self.logit_bias:
            if not _integer(token):
                raise bad("logit_bias", f"token ids must be integers, got {token!r}")
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


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
