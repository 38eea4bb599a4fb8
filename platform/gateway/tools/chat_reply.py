"""A chat completion's side of tool calling: which format, the reply, the stream deltas.

The route asks `chat_tooling` once per request, then turns each choice's text into an
assistant message (`assistant_reply`) or its stream items into chunk deltas
(`stream_deltas`), in OpenAI's chat shapes (the legacy `functions` API answers with
`function_call`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import InvalidParameterError
from gateway.reasoning import split_reasoning
from gateway.schemas.chat import (
    AssistantMessage,
    ChatCompletionRequest,
    ChunkDelta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
)
from gateway.tools.parsers import ParserName, ParserSetting, choose_parser, new_call_id
from gateway.tools.schemas import ToolRequest, resolve_tools
from gateway.tools.streaming import (
    ContentDelta,
    StreamingToolParser,
    StreamItem,
    ToolCallStart,
    parse_tool_calls,
)


@dataclass(frozen=True)
class ChatTooling:
    """The request's tool calling and the format the model writes calls in."""

    request: ToolRequest
    parser: ParserName

    @property
    def active(self) -> bool:
        """Whether calls are parsed out of this request's output."""
        return self.request.active

    def stream_parser(self) -> StreamingToolParser:
        """A fresh incremental parser for one choice."""
        return StreamingToolParser(
            self.parser, names=self.request.names, parallel=self.request.parallel
        )


def chat_tooling(
    body: ChatCompletionRequest, *, setting: ParserSetting, chat_template: str | None
) -> ChatTooling:
    """The body's tools validated, and the parser the setting and template choose."""
    request = resolve_tools(
        tools=body.tools,
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        functions=body.functions,
        function_call=body.function_call,
    )
    parser = choose_parser(setting, chat_template)
    if request.active and parser == "none":
        raise InvalidParameterError(
            "tool calling is not enabled for this model", param="tools", code="unsupported"
        )
    return ChatTooling(request, parser)


def finish_reason(reason: str | None, calls: int, tooling: ChatTooling) -> str | None:
    """OpenAI's finish reason: a turn that stops after calls ends with `tool_calls`."""
    if not calls or reason != "stop":
        return reason
    return "function_call" if tooling.request.legacy else "tool_calls"


def assistant_reply(
    text: str, tooling: ChatTooling, *, reasoning: bool = False
) -> tuple[AssistantMessage, int]:
    """The assistant message of one choice's text, and how many calls it holds.

    `reasoning`: a thinking block is returned apart (`reasoning_content`), and only the
    answer is searched for calls.
    """
    thought, text = split_reasoning(text) if reasoning else (None, text)
    if not tooling.active:
        return AssistantMessage(content=text, reasoning_content=thought), 0
    req = tooling.request
    parsed = parse_tool_calls(text, tooling.parser, names=req.names, parallel=req.parallel)
    calls = [FunctionCall(name=c.name, arguments=c.arguments) for c in parsed.calls]
    message = AssistantMessage(content=parsed.content, reasoning_content=thought)
    if not calls:
        return message, 0
    if req.legacy:
        return message.model_copy(update={"function_call": calls[0]}), 1
    tool_calls = [ToolCall(id=new_call_id(), function=f) for f in calls]
    return message.model_copy(update={"tool_calls": tool_calls}), len(calls)


def stream_deltas(items: list[StreamItem], *, legacy: bool) -> list[ChunkDelta]:
    """Parser items as chunk deltas, in OpenAI's streaming shape."""
    out: list[ChunkDelta] = []
    for item in items:
        if isinstance(item, ContentDelta):
            out.append(ChunkDelta(content=item.text))
            continue
        if isinstance(item, ToolCallStart):
            function = FunctionCallDelta(name=item.name, arguments="")
            call = ToolCallDelta(index=item.index, id=item.id, type="function", function=function)
        else:
            function = FunctionCallDelta(arguments=item.arguments)
            call = ToolCallDelta(index=item.index, function=function)
        out.append(ChunkDelta(function_call=function) if legacy else ChunkDelta(tool_calls=[call]))
    return out
