"""What the tool-calling tests over HTTP share (tests/gateway/test_tools_http.py for
chat completions, tests/gateway/test_responses_tools.py for responses): the two
functions they offer, and a gateway whose engine answers every greedy request with
two hermes-format calls.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.fronts.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.scripted_engine import inject_script, one_token_per_char

# The functions offered, without the wrapping each API puts around them.
WEATHER_FUNCTION: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME_FUNCTION: dict[str, Any] = {
    "name": "get_time",
    "parameters": {
        "type": "object",
        "properties": {"utc": {"type": "boolean"}},
        "required": ["utc"],
        "additionalProperties": False,
    },
}
# The scripted answer: some text, then two calls in the hermes format.
SCRIPTED = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"utc": true}}\n</tool_call>'
)
# Room for the tools' prompt and a whole script (the tiny model's shape allows 2048).
SCRIPTED_MAX_MODEL_LEN = 2048


def scripted_tools_tokens(engine: LLMEngine) -> list[int]:
    """SCRIPTED in `engine`'s vocabulary, one token per character but for its first "</"
    (one token): with the end-of-sequence token that ends it, the whole reply is
    `len(SCRIPTED)` tokens, each with its logprob."""
    return one_token_per_char(engine, SCRIPTED, but="</")


def scripted_tools_engine() -> AsyncEngine:
    """The real AsyncEngine over the fake fast model, answering every greedy request
    with SCRIPTED (as `scripted_tools_tokens`), then end-of-sequence."""
    llm = fast_fake_llm_engine(
        **{**GATEWAY_ENGINE_OPTIONS, "max_model_len": SCRIPTED_MAX_MODEL_LEN}
    )
    return AsyncEngine(inject_script(llm, scripted_tools_tokens(llm)))


def start_scripted_tools_gateway(tmp: Path) -> tuple[LiveGateway, Callable[[], None]]:
    """A live gateway (hermes tool parser) over `scripted_tools_engine()`, and its stop."""
    return start_gateway(
        tmp, engine=scripted_tools_engine(), limiter=MemoryLimiter(), tool_parser="hermes"
    )
