"""Tool calls out of generated text: each family's format, malformed output, streaming."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from gateway.tools import (
    ContentDelta,
    StreamingToolParser,
    ToolCallArguments,
    ToolCallStart,
    detect_parser,
    parse_tool_calls,
)
from gateway.tools.parsers import ParserName

NAMES = frozenset({"get_weather", "get_time"})


def _args(text: str) -> object:
    return json.loads(text)


def test_hermes_one_block_per_call_with_content_before() -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n</tool_call>'
    )
    out = parse_tool_calls(text, "hermes", names=NAMES)
    assert out.content == "Let me check."
    assert [c.name for c in out.calls] == ["get_weather", "get_time"]
    assert _args(out.calls[0].arguments) == {"city": "Paris"}
    assert _args(out.calls[1].arguments) == {"tz": "Europe/Paris"}


def test_only_calls_give_null_content() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
    out = parse_tool_calls(text, "hermes", names=NAMES)
    assert out.content is None
    assert len(out.calls) == 1 and out.calls[0].arguments == "{}"


def test_smollm2_list_and_single_object() -> None:
    listed = (
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Zürich"}}, '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}]</tool_call>'
    )
    out = parse_tool_calls(listed, "smollm2", names=NAMES)
    assert out.content is None
    assert [c.name for c in out.calls] == ["get_weather", "get_time"]
    # Unicode survives as text, not \\u escapes.
    assert out.calls[0].arguments == '{"city": "Zürich"}'
    single = '<tool_call>{"name": "get_time", "arguments": {"tz": "東京"}}</tool_call>'
    out = parse_tool_calls(single, "smollm2", names=NAMES)
    assert [(c.name, _args(c.arguments)) for c in out.calls] == [("get_time", {"tz": "東京"})]


def test_smollm2_empty_list_means_no_call() -> None:
    out = parse_tool_calls("<tool_call>[]</tool_call>", "smollm2", names=NAMES)
    assert out.calls == () and out.content == ""


def test_llama3_json_with_and_without_python_tag() -> None:
    plain = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    out = parse_tool_calls(plain, "llama3_json", names=NAMES)
    assert out.content is None
    assert [(c.name, _args(c.arguments)) for c in out.calls] == [("get_weather", {"city": "Oslo"})]
    tagged = '<|python_tag|>{"name": "get_time", "parameters": {"tz": "UTC"}}; ' + plain
    out = parse_tool_calls(tagged, "llama3_json", names=NAMES)
    assert [c.name for c in out.calls] == ["get_time", "get_weather"]


def test_llama3_text_is_content() -> None:
    text = "The weather in Oslo is {unknown} today."
    out = parse_tool_calls(text, "llama3_json", names=NAMES)
    assert out == parse_tool_calls(text, "none")
    assert out.content == text and out.calls == ()


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "launch_missiles", "arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "get_time", "arguments": [1, 2]}\n</tool_call>'),
        ("hermes", "<tool_call>\nnot json at all"),
        ("smollm2", '<tool_call>[{"name": "get_time"}, 42]</tool_call>'),
        ("llama3_json", '{"name": "get_time", "parameters": {"tz": '),
        ("llama3_json", '{"nam": "get_time"}'),
    ],
)
def test_malformed_calls_fall_back_to_content(parser: ParserName, text: str) -> None:
    out = parse_tool_calls(text, parser, names=NAMES)
    assert out.calls == ()
    assert out.content == text


def test_arguments_given_as_json_text_are_accepted() -> None:
    text = '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}\n</tool_call>'
    out = parse_tool_calls(text, "hermes", names=NAMES)
    assert _args(out.calls[0].arguments) == {"tz": "UTC"}


def test_parallel_false_keeps_the_first_call() -> None:
    text = (
        '<tool_call>[{"name": "get_time", "arguments": {}}, '
        '{"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>'
    )
    out = parse_tool_calls(text, "smollm2", names=NAMES, parallel=False)
    assert [c.name for c in out.calls] == ["get_time"]


def test_text_without_calls_is_unchanged() -> None:
    text = "  Hello <tool_ there, a < b and <tool_callx> too.\n\n"
    for parser in ("hermes", "smollm2", "llama3_json"):
        assert parse_tool_calls(text, parser, names=NAMES).content == text


def test_detect_parser_from_templates() -> None:
    smol = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    assert detect_parser(smol) == "smollm2"
    assert detect_parser(smol, model_type="qwen2") == "hermes"
    qwen = "{%- if tools %}<tools>{{ tool | tojson }}</tools> <tool_call> <|im_start|>"
    assert detect_parser(qwen) == "hermes"
    llama = "<|start_header_id|>ipython<|end_header_id|> <|python_tag|> <|eot_id|>"
    assert detect_parser(llama) == "llama3_json"
    assert detect_parser(None) == "none"
    mistral = "{%- if tools %}[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
    assert detect_parser(mistral) == "mistral"


@functools.lru_cache(maxsize=1)
def _smollm2() -> Any:
    from transformers import AutoTokenizer

    from tests.utils.tiny_model import smollm2_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))


def _token_pieces(text: str) -> list[str]:
    """`text` split the way the detokenizer streams it: one SmolLM2 token at a time."""
    hf = _smollm2()
    ids = hf.encode(text, add_special_tokens=False)
    pieces, previous = [], ""
    for end in range(1, len(ids) + 1):
        decoded = hf.decode(ids[:end])
        if decoded.endswith("\ufffd"):
            continue  # half a UTF-8 character: the detokenizer holds it back too
        pieces.append(decoded[len(previous) :])
        previous = decoded
    assert "".join(pieces) == text
    return pieces


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (
            "hermes",
            'Sure — checking.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "São Paulo"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
            '"arguments": {"tz": "America/Sao_Paulo"}}\n</tool_call>',
        ),
        (
            "smollm2",
            '<tool_call>[{"name": "get_weather", "arguments": {"city": "Kyōto"}}]</tool_call>',
        ),
        ("llama3_json", '{"name": "get_time", "parameters": {"tz": "UTC"}}'),
        (
            "mistral",
            'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}}, '
            '{"name": "get_time", "arguments": {"tz": "CET"}}]',
        ),
        ("mistral", '[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}[TOOL_CALLS]get_weather[ARGS]{}'),
        ("mistral", "Arrays look like [1, 2] and [TOOL_ is not a marker."),
        ("hermes", "No tools needed: 3 < 4 and <tool_ is not a marker. 🌧️"),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": '),
    ],
)
def test_streamed_tokens_reassemble_to_the_whole_parse(parser: ParserName, text: str) -> None:
    whole = parse_tool_calls(text, parser, names=NAMES)
    stream = StreamingToolParser(parser, names=NAMES)
    items = [item for piece in _token_pieces(text) for item in stream.feed(piece)]
    items += stream.finish()
    content = "".join(i.text for i in items if isinstance(i, ContentDelta))
    starts = [i for i in items if isinstance(i, ToolCallStart)]
    args = [i for i in items if isinstance(i, ToolCallArguments)]
    assert (content or None if whole.calls else content) == whole.content
    assert [(s.index, s.name) for s in starts] == [(i, c.name) for i, c in enumerate(whole.calls)]
    assert [a.arguments for a in args] == [c.arguments for c in whole.calls]
    assert all(s.id.startswith("call_") and len(s.id) == 29 for s in starts)
    # Each call's start comes before its arguments.
    for start in starts:
        assert items.index(start) < next(items.index(a) for a in args if a.index == start.index)


def test_streaming_holds_back_a_partial_marker_only() -> None:
    stream = StreamingToolParser("hermes", names=NAMES)
    assert stream.feed("Hi <tool") == [ContentDelta("Hi")]
    assert stream.feed("box>") == [ContentDelta(" <toolbox>")]
    assert stream.feed("<tool_call>\n{") == []
    assert stream.feed('"name": "get_time", "arguments": {}}\n</tool_call>')[1:] == [
        ToolCallArguments(0, "get_time", "{}")
    ]
    assert stream.finish() == []
    assert stream.calls == 1


def test_mistral_json_list_and_newer_segments() -> None:
    listed = parse_tool_calls(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}]',
        "mistral",
        names=NAMES,
    )
    assert listed.content is None
    assert [(c.name, _args(c.arguments)) for c in listed.calls] == [
        ("get_weather", {"city": "Nice"})
    ]
    segments = parse_tool_calls(
        'Sure.[TOOL_CALLS]get_time[ARGS]{"tz": "UTC"}[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}',
        "mistral",
        names=NAMES,
    )
    assert segments.content == "Sure."
    assert [c.name for c in segments.calls] == ["get_time", "get_weather"]


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]',  # not a declared function
        "[TOOL_CALLS]get_time[ARGS]{not json",
        "[TOOL_CALLS]get_time{}",  # no [ARGS]
        '[TOOL_CALLS][{"name": "get_time", "arguments": [1]}]',
    ],
)
def test_malformed_mistral_calls_are_content(text: str) -> None:
    parsed = parse_tool_calls(text, "mistral", names=NAMES)
    assert parsed.calls == () and parsed.content == text


def test_the_mistral_call_grammar_compiles_and_holds_its_format() -> None:
    from gateway.tools.constraints import tool_call_grammar, validate
    from gateway.tools.schemas import resolve_tools

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]  # fmt: skip
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        request = resolve_tools(
            tools=tools, tool_choice=choice, parallel_tool_calls=True, functions=None,
            function_call=None,
        )  # fmt: skip
        spec = tool_call_grammar(request, "mistral")
        assert spec is not None and validate(spec.value) == ""
        assert '"[TOOL_CALLS]["' in spec.value
