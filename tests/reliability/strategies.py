"""Hypothesis strategies for hostile request bodies of /v1/chat/completions and /v1/completions.

Every field is drawn from plausible values, edge values (0, -1, 1e-300, 5e-324, 1e308,
huge integers, NaN and Infinity, which are not JSON) and arbitrary JSON, so that both
the validators and whatever is behind them see nonsense. Bodies are JSON *text*, built
by `encode`: Python's json module cannot write a lone surrogate's escape only when asked,
nor a 5,000-digit integer, and the gateway must survive both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

MODEL = "tiny"


@dataclass(frozen=True)
class Raw:
    """JSON text inserted as it is (a number json.dumps refuses to write, broken JSON)."""

    text: str


def encode(value: Any) -> bytes:
    """`value` as JSON text: lone surrogates escaped, NaN/Infinity as Python writes them."""
    if isinstance(value, Raw):
        return value.text.encode()
    if isinstance(value, dict):
        items = b",".join(encode(str(k)) + b":" + encode(v) for k, v in value.items())
        return b"{" + items + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(encode(v) for v in value) + b"]"
    return json.dumps(value, ensure_ascii=True, allow_nan=True).encode()


SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
# Lone surrogates (and, below, 5,000-digit integers) are kept rare: each is one defect,
# and where they are everywhere every body fails on them before reaching anything else.
TEXT = st.one_of(
    st.text(max_size=40),
    st.text(max_size=40),
    st.text(max_size=40),
    st.text(st.one_of(st.characters(), SURROGATES), max_size=12),
    st.sampled_from(["", "\x00", "\ud800", "a\udfffb", "<|im_end|>", "\u202e", "🙂" * 5]),
)
EDGE_FLOATS = st.sampled_from(
    [0.0, -0.0, 5e-324, 1e-300, 1e-46, 1e-38, 1e-6, 1e-5, 0.5, 1.0, 2.0, 2.0000001, -1.0]
    + [1e308, float("inf"), float("-inf"), float("nan")]
)
FLOATS = st.one_of(EDGE_FLOATS, st.floats(), st.floats(-3, 3))
EDGE_INTS = st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 4, 5, 17, 2**31, 2**63, 10**30])
HUGE_INT = st.just(Raw("1" * 5000))
INTS = st.one_of(EDGE_INTS, st.integers())
JSON_LEAVES = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
ANY_JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
DEEP = st.integers(min_value=200, max_value=1200).map(lambda n: Raw("[" * n + "]" * n))


def field_of(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly plausible values, sometimes any JSON at all."""
    return st.one_of(plausible, plausible, plausible, ANY_JSON)


SMALL_MAX_TOKENS = st.integers(min_value=1, max_value=6)
PROMPT_TOKEN_IDS = st.lists(st.one_of(st.integers(0, 49151), EDGE_INTS), min_size=0, max_size=8)
PROMPT_TEXT = st.one_of(st.text(min_size=1, max_size=60), TEXT)

SAMPLING = {
    "temperature": field_of(FLOATS),
    "top_p": field_of(FLOATS),
    "top_k": field_of(INTS),
    "min_p": field_of(FLOATS),
    "n": field_of(st.integers(-1, 6)),
    "stop": field_of(st.one_of(TEXT, st.lists(TEXT, max_size=5))),
    "seed": st.one_of(field_of(INTS), HUGE_INT),
    "presence_penalty": field_of(FLOATS),
    "frequency_penalty": field_of(FLOATS),
    "repetition_penalty": field_of(FLOATS),
    "logit_bias": field_of(
        st.dictionaries(st.one_of(st.integers(-5, 50000).map(str), TEXT), FLOATS, max_size=4)
    ),
    "user": field_of(TEXT),
    "stream": field_of(st.booleans()),
    "stream_options": field_of(
        st.one_of(st.none(), st.fixed_dictionaries({"include_usage": st.booleans()}))
    ),
    "cache": field_of(st.booleans()),
    "cache_salt": field_of(TEXT),
    "response_format": ANY_JSON,
    "metadata": st.one_of(ANY_JSON, ANY_JSON, ANY_JSON, DEEP),
    "tools": ANY_JSON,
}


def _max_tokens() -> st.SearchStrategy[Any]:
    # Mostly small (the fuzz must stay quick), sometimes anything at all.
    return st.one_of(SMALL_MAX_TOKENS, SMALL_MAX_TOKENS, SMALL_MAX_TOKENS, field_of(INTS))


MESSAGE = st.fixed_dictionaries(
    {
        "role": field_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"])),
        "content": field_of(
            st.one_of(
                TEXT,
                st.none(),
                st.lists(
                    st.fixed_dictionaries(
                        {"type": field_of(st.sampled_from(["text", "image_url"])), "text": TEXT}
                    ),
                    max_size=3,
                ),
            )
        ),
    },
    optional={"name": field_of(TEXT), "tool_calls": ANY_JSON},
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A hostile /v1/chat/completions body."""
    body: dict[str, Any] = {
        "model": draw(field_of(st.just(MODEL))),
        "messages": draw(field_of(st.lists(MESSAGE, min_size=1, max_size=3))),
        "max_tokens": draw(_max_tokens()),
    }
    extra = draw(
        st.fixed_dictionaries(
            {},
            optional={
                **SAMPLING,
                "max_completion_tokens": field_of(SMALL_MAX_TOKENS),
                "logprobs": field_of(st.booleans()),
                "top_logprobs": field_of(st.integers(-1, 21)),
            },
        )
    )
    return {**body, **extra}


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A hostile /v1/completions body: text, many texts, token ids or lists of them."""
    prompt = draw(
        field_of(
            st.one_of(
                PROMPT_TEXT,
                st.lists(PROMPT_TEXT, min_size=1, max_size=3),
                PROMPT_TOKEN_IDS,
                st.lists(PROMPT_TOKEN_IDS, min_size=1, max_size=3),
            )
        )
    )
    body: dict[str, Any] = {
        "model": draw(field_of(st.just(MODEL))),
        "prompt": prompt,
        "max_tokens": draw(_max_tokens()),
    }
    extra = draw(
        st.fixed_dictionaries(
            {},
            optional={
                **SAMPLING,
                "logprobs": field_of(st.integers(-1, 21)),
                "echo": field_of(st.booleans()),
                "suffix": field_of(TEXT),
                "best_of": field_of(st.integers(-1, 6)),
            },
        )
    )
    return {**body, **extra}
