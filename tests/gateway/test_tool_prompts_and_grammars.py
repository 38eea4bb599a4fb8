"""Tools in the prompt (through the gateway's prompt layer) and the call grammars (llguidance)."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import llguidance
import llguidance.hf
import pytest

from engine.model.tokenizer import Tokenizer, load_hf_tokenizer
from engine.structured.spec import StructuredSpec
from gateway.errors import InvalidParameterError
from gateway.schemas.chat import ChunkDelta, FunctionCallDelta, ToolCallDelta
from gateway.tokenize import PromptTokenizer
from gateway.tools import render_chat, resolve_tools, tool_call_grammar
from gateway.tools.parsers import ParserName
from gateway.tools.prompting import render_calls
from tests.utils.tiny_model import smollm2_tokenizer_dir

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "strict": True, "parameters": {"type": "object"}},
}
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21"},
]


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    return load_hf_tokenizer(smollm2_tokenizer_dir())


@functools.lru_cache(maxsize=1)
def _ll_tokenizer() -> Any:
    return llguidance.hf.from_tokenizer(_tokenizer().hf)


class _Engine:
    """The EngineClient surface PromptTokenizer reads."""

    max_model_len = 8192

    @property
    def tokenizer(self) -> Tokenizer:
        return _tokenizer()


def _prompt_text(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The prompt the gateway would encode for `messages`, decoded back to text."""
    tok = _tokenizer()
    request = resolve_tools(tools=tools)
    rendered = render_chat(messages, request, "smollm2", chat_template=tok.chat_template)
    prompts = PromptTokenizer(_Engine())  # type: ignore[arg-type]
    try:
        ids = asyncio.run(prompts.encode_chat("t1", rendered.messages, tools=rendered.tools))
    finally:
        prompts.close()
    return tok.decode(ids, skip_special_tokens=False)


def test_smollm2_prompt_declares_the_tools_and_writes_out_the_history() -> None:
    text = _prompt_text(HISTORY, [WEATHER])
    assert text.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    tools = text[text.index("<tools>") + len("<tools>") : text.index("</tools>")]
    assert json.loads(tools) == [WEATHER]
    assert "Weather of a city, in °C." in text
    assert (
        '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}]</tool_call><|im_end|>'
    ) in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_tools_join_an_existing_system_message() -> None:
    text = _prompt_text([{"role": "system", "content": "Be brief."}, *HISTORY[:1]], [WEATHER])
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou are an expert")
    assert text.count("<|im_start|>system") == 1


def test_no_tools_renders_exactly_the_old_prompt() -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert _prompt_text(messages, None) == _tokenizer().apply_chat_template(messages)


NATIVE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}\n{% endif %}"
    "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} {{ c.function.arguments.city }}"
    "{% endfor %}{% if m.tool_call_id %}(for {{ m.tool_call_id }}){% endif %}\n{% endfor %}"
)


def test_a_template_that_renders_tools_gets_them_natively() -> None:
    request = resolve_tools(tools=[WEATHER, TIME])
    rendered = render_chat(HISTORY, request, "hermes", chat_template=NATIVE)
    assert rendered.tools is not None and rendered.tools[0] == WEATHER
    assert [t["function"]["name"] for t in rendered.tools] == ["get_weather", "get_time"]
    hf = _tokenizer().hf
    text = hf.apply_chat_template(
        rendered.messages, tools=rendered.tools, chat_template=NATIVE, tokenize=False
    )
    assert text.startswith("TOOLS:get_weather;get_time;[user]Weather in Paris?")
    # Arguments reach the template as an object, not JSON text.
    assert "CALL get_weather Paris" in text
    assert "[tool]sunny, 21(for call_1)" in text


@pytest.mark.parametrize("parser", ["hermes", "smollm2", "llama3_json"])
def test_history_calls_are_written_in_the_format_the_parser_reads(parser: ParserName) -> None:
    from gateway.tools import parse_tool_calls

    text = render_calls(HISTORY[1]["tool_calls"] * 2, parser)
    parsed = parse_tool_calls(text, parser)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"})
    ] * 2


def _accepts(spec: StructuredSpec, text: str) -> bool:
    matcher = llguidance.LLMatcher(_ll_tokenizer(), spec.value)
    ids = _tokenizer().encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def _grammar(parser: ParserName, **choice: Any) -> StructuredSpec:
    spec = tool_call_grammar(resolve_tools(tools=[WEATHER, TIME], **choice), parser)
    assert spec is not None and spec.kind == "lark"
    error = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_lark(spec.value), _ll_tokenizer()
    )
    assert not error, error
    return spec


@pytest.mark.parametrize(
    ("parser", "good", "bad"),
    [
        (
            "hermes",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}'
            '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            '<tool_call>\n{"name": "get_weather", "arguments": {"days": 2}}\n</tool_call>',
        ),
        (
            "smollm2",
            '<tool_call>[{"name": "get_time", "arguments": {}}, '
            '{"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>',
            '<tool_call>[{"name": "get_date", "arguments": {}}]</tool_call>',
        ),
        (
            "llama3_json",
            '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            '{"name": "get_weather", "parameters": {"city": 3}}',
        ),
    ],
)
def test_required_grammar_takes_valid_calls_only(parser: ParserName, good: str, bad: str) -> None:
    spec = _grammar(parser, tool_choice="required")
    assert _accepts(spec, good)
    assert not _accepts(spec, bad)
    assert not _accepts(spec, "I would rather not call anything.")


def test_named_grammar_takes_only_that_function_once() -> None:
    spec = _grammar("hermes", tool_choice={"type": "function", "function": {"name": "get_time"}})
    one = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert _accepts(spec, one)
    assert not _accepts(spec, one + "\n" + one)
    assert not _accepts(
        spec, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )


def test_auto_with_a_strict_tool_takes_text_or_valid_calls() -> None:
    spec = _grammar("hermes")
    assert _accepts(spec, "It is sunny, no call needed.")
    assert _accepts(spec, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    # Non-strict tools take any arguments object; strict ones their schema.
    assert _accepts(
        spec, '<tool_call>\n{"name": "get_weather", "arguments": {"x": 1}}\n</tool_call>'
    )
    assert not _accepts(spec, '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>')


def test_free_choices_have_no_grammar() -> None:
    assert tool_call_grammar(resolve_tools(tools=[WEATHER]), "hermes") is None
    assert tool_call_grammar(resolve_tools(tools=[WEATHER], tool_choice="none"), "hermes") is None
    assert tool_call_grammar(resolve_tools(), "hermes") is None


def test_a_schema_llguidance_cannot_compile_is_a_400() -> None:
    broken = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 5}}},
    }
    with pytest.raises(InvalidParameterError) as caught:
        tool_call_grammar(resolve_tools(tools=[broken], tool_choice="required"), "hermes")
    assert caught.value.param == "tools"


def test_stream_deltas_serialize_as_openai_sends_them() -> None:
    first = ToolCallDelta(
        index=0, id="call_x", type="function", function=FunctionCallDelta(name="f", arguments="")
    )
    more = ToolCallDelta(index=0, function=FunctionCallDelta(arguments='{"a": 1}'))
    assert json.loads(ChunkDelta(tool_calls=[first]).model_dump_json()) == {
        "role": None,
        "content": None,
        "tool_calls": [
            {
                "index": 0,
                "id": "call_x",
                "type": "function",
                "function": {"name": "f", "arguments": ""},
            }
        ],
    }
    assert json.loads(more.model_dump_json()) == {"index": 0, "function": {"arguments": '{"a": 1}'}}
    assert "tool_calls" not in json.loads(ChunkDelta(content="hi").model_dump_json())
