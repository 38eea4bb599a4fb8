"""An incremental tool-call parser: text deltas in, content and call deltas out.

Content streams as it comes, except text that may be the start of a call marker
(`<tool_call>`, `<|python_tag|>`) and trailing whitespace, which wait for what follows.
A call is emitted once its block is complete and parses (a block that does not parse
is given back as content), as OpenAI streams calls: first `ToolCallStart` (index, id,
name; arguments ""), then `ToolCallArguments`. Llama 3's bare JSON calls are known
to be calls only when the output ends, so output that starts like JSON waits for it.

    text:   "Let me look.\\n<tool_call>\\n{...}\\n</tool_call>"
    items:  Content("Let me look.")  Start(0, call_x, name)  Arguments(0, '{...}')
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tools.parsers import (
    MISTRAL_CALLS,
    PYTHON_TAG,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedCall,
    ParsedOutput,
    ParserName,
    calls_from_block,
    mistral_calls,
    new_call_id,
)


@dataclass(frozen=True)
class ContentDelta:
    """Plain text for the message's content."""

    text: str


@dataclass(frozen=True)
class ToolCallStart:
    """A new call: its index among this message's calls, its id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """The arguments (JSON text) of the call at `index`."""

    index: int
    name: str
    arguments: str


StreamItem = ContentDelta | ToolCallStart | ToolCallArguments


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class StreamingToolParser:
    """Feeds on one choice's text deltas; `finish()` once the choice has ended."""

    def __init__(
        self, parser: ParserName, *, names: frozenset[str] | None = None, parallel: bool = True
    ) -> None:
        self._parser = parser
        self._names = names
        self._parallel = parallel
        # Hermes and SmolLM2 close each block; Llama's JSON and Mistral's calls run to the
        # end of output.
        self._open = {"llama3_json": PYTHON_TAG, "mistral": MISTRAL_CALLS}.get(
            parser, TOOL_CALL_OPEN
        )
        self._close = None if parser in ("llama3_json", "mistral") else TOOL_CALL_CLOSE
        self._key = "parameters" if parser == "llama3_json" else "arguments"
        self._buffer = ""
        self._in_call = False
        self._opener = ""  # the marker that opened the current block, given back if it fails
        self._at_start = True  # nothing but whitespace seen yet (Llama's bare JSON)
        self._held = ""  # trailing whitespace not yet sent
        self._count = 0

    @property
    def calls(self) -> int:
        """How many calls were emitted so far."""
        return self._count

    def feed(self, text: str) -> list[StreamItem]:
        """The items `text` completes."""
        if self._parser == "none":
            return [ContentDelta(text)] if text else []
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[StreamItem]:
        """Everything still held: an unclosed block is a call if it parses, else content."""
        if self._parser == "none":
            return []
        out = self._drain(final=True)
        if self._held and not self._count:
            out.append(ContentDelta(self._held))
        self._held = ""
        return out

    def _drain(self, *, final: bool) -> list[StreamItem]:
        out: list[StreamItem] = []
        while True:
            if self._in_call:
                end = -1 if self._close is None else self._buffer.find(self._close)
                if end < 0 and not final:
                    return out
                block = self._buffer if end < 0 else self._buffer[:end]
                closer = "" if end < 0 or self._close is None else self._close
                self._buffer = "" if end < 0 else self._buffer[end + len(closer) :]
                self._in_call = False
                out.extend(self._block(block, opener=self._opener, closer=closer))
                continue
            if self._at_start and self._parser == "llama3_json":
                head = self._buffer.lstrip()
                if not head and not final:
                    return out
                if head.startswith(("{", "[")):
                    self._in_call, self._opener = True, ""
                    continue
            start = self._buffer.find(self._open)
            if start >= 0:
                out.extend(self._content(self._buffer[:start]))
                self._buffer = self._buffer[start + len(self._open) :]
                self._in_call, self._opener = True, self._open
                continue
            keep = 0 if final else partial_suffix(self._buffer, self._open)
            out.extend(self._content(self._buffer[: len(self._buffer) - keep]))
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return out

    def _block(self, block: str, *, opener: str, closer: str) -> list[StreamItem]:
        calls = (
            mistral_calls(block, names=self._names)
            if self._parser == "mistral"
            else calls_from_block(block, arguments_key=self._key, names=self._names)
        )
        if calls is None:
            return self._content(opener + block + closer)
        self._held = ""  # whitespace between content and calls, or between calls
        self._at_start = False
        out: list[StreamItem] = []
        for call in calls:
            if self._count and not self._parallel:
                break
            out.append(ToolCallStart(self._count, new_call_id(), call.name))
            out.append(ToolCallArguments(self._count, call.name, call.arguments))
            self._count += 1
        return out

    def _content(self, text: str) -> list[StreamItem]:
        if not text:
            return []
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        if not body:
            return []
        self._at_start = False
        return [ContentDelta(body)]


def parse_tool_calls(
    text: str,
    parser: ParserName,
    *,
    names: frozenset[str] | None = None,
    parallel: bool = True,
) -> ParsedOutput:
    """Content and calls of a whole generated text (calls only of `names`, if given)."""
    stream = StreamingToolParser(parser, names=names, parallel=parallel)
    content: list[str] = []
    calls: list[ParsedCall] = []
    for item in [*stream.feed(text), *stream.finish()]:
        if isinstance(item, ContentDelta):
            content.append(item.text)
        elif isinstance(item, ToolCallArguments):
            calls.append(ParsedCall(item.name, item.arguments))
    joined = "".join(content)
    return ParsedOutput(None if calls and not joined else joined, tuple(calls))
