"""Tool (function) calling: request validation, prompting, parsing, constraints.

schemas      resolve_tools(...) -> ToolRequest          (validated tools and choice)
prompting    render_chat(messages, tools, parser, ...)  (what the template renders)
parsers      choose_parser / detect_parser               (the family's call format)
streaming    StreamingToolParser, parse_tool_calls       (calls out of the text)
constraints  tool_call_grammar(tools, parser)            (required/named/strict)
"""

from gateway.tools.constraints import tool_call_grammar
from gateway.tools.parsers import (
    ParsedCall,
    ParsedOutput,
    ParserName,
    choose_parser,
    detect_parser,
    new_call_id,
)
from gateway.tools.prompting import RenderedChat, render_chat
from gateway.tools.schemas import FunctionTool, ToolRequest, resolve_tools
from gateway.tools.streaming import (
    ContentDelta,
    StreamingToolParser,
    ToolCallArguments,
    ToolCallStart,
    parse_tool_calls,
)

__all__ = [
    "ContentDelta",
    "FunctionTool",
    "ParsedCall",
    "ParsedOutput",
    "ParserName",
    "RenderedChat",
    "StreamingToolParser",
    "ToolCallArguments",
    "ToolCallStart",
    "ToolRequest",
    "choose_parser",
    "detect_parser",
    "new_call_id",
    "parse_tool_calls",
    "render_chat",
    "resolve_tools",
    "tool_call_grammar",
]
