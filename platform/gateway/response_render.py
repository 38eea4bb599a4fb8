"""Response objects and their typed stream events, from one request's finished or running text.

A stream is, with a `sequence_number` counting from 0 across all of it:

    response.created -> response.in_progress
    [message]  response.output_item.added -> response.content_part.added
               -> response.output_text.delta x N -> response.output_text.done
               -> response.content_part.done -> response.output_item.done
    [call] x K response.output_item.added -> response.function_call_arguments.delta
               -> response.function_call_arguments.done -> response.output_item.done
    -> response.completed | response.incomplete

(`response.incomplete` when the output budget ran out, as OpenAI sends it), each
as `event: <type>` plus `data: <json>`, with no `[DONE]` after it. Without tools the
message opens at once; with them it opens at the first text, and a turn that only
calls functions has no message item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from gateway.schemas.responses import (
    ContentPartEvent,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    FunctionCallItem,
    IncompleteDetails,
    OutputItemEvent,
    OutputMessage,
    OutputText,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ResponseLifecycleEvent,
    ResponseObject,
    ResponseUsage,
    StreamErrorEvent,
)

# Engine finish reasons that end a response early; "stop" (and none) completes it.
_INCOMPLETE: dict[str, Literal["max_output_tokens"]] = {"length": "max_output_tokens"}
Status = Literal["in_progress", "completed", "incomplete"]
LifecycleKind = Literal[
    "response.created", "response.in_progress", "response.completed", "response.incomplete"
]


def sse_typed(event: BaseModel, kind: str) -> bytes:
    """One `event: <kind>` / `data: <json>` server-sent event."""
    return b"event: " + kind.encode() + b"\ndata: " + event.model_dump_json().encode() + b"\n\n"


@dataclass(frozen=True)
class ResponseDraft:
    """What a response echoes of its request, fixed before any token is generated."""

    response_id: str
    item_id: str  # the id of the output message item
    created_at: int
    model: str
    instructions: str | None
    max_output_tokens: int | None
    previous_response_id: str | None
    store: bool
    temperature: float | None
    top_p: float | None
    user: str | None
    metadata: dict[str, str] = field(default_factory=dict)
    tools: tuple[Any, ...] = ()  # echoed as the request gave them
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True

    def response(
        self,
        *,
        text: str | None,
        finish_reason: str | None = None,
        usage: ResponseUsage | None = None,
        completed_at: int | None = None,
        calls: Sequence[FunctionCallItem] = (),
    ) -> ResponseObject:
        """The response object: in progress (text None, no output yet) or finished, its
        output the message (none when `calls` are all there is) then the calls."""
        status: Status = "in_progress"
        output: list[OutputMessage | FunctionCallItem] = []
        incomplete: IncompleteDetails | None = None
        if text is not None:
            reason = _INCOMPLETE.get(finish_reason or "")
            status = "completed" if reason is None else "incomplete"
            incomplete = None if reason is None else IncompleteDetails(reason=reason)
            output = [self.message(text, status)] if text or not calls else []
            output += calls
        return ResponseObject(
            id=self.response_id,
            created_at=self.created_at,
            status=status,
            completed_at=completed_at if text is not None else None,
            incomplete_details=incomplete,
            instructions=self.instructions,
            max_output_tokens=self.max_output_tokens,
            model=self.model,
            output=output,
            previous_response_id=self.previous_response_id,
            store=self.store,
            temperature=self.temperature,
            top_p=self.top_p,
            usage=usage,
            user=self.user,
            metadata=self.metadata,
            tools=list(self.tools),
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
        )

    def message(self, text: str | None, status: Status) -> OutputMessage:
        """The output message item (no content part while `text` is None)."""
        content = [] if text is None else [OutputText(text=text)]
        return OutputMessage(id=self.item_id, status=status, content=content)


class ResponseEvents:
    """The events of one streamed response, numbered in the order they are made."""

    def __init__(self, draft: ResponseDraft) -> None:
        self.draft = draft
        self.text = ""
        self.calls: list[FunctionCallItem] = []
        self._sequence = 0
        self._outputs = 0  # output items opened so far
        self._message_index: int | None = None  # the message's output index, once open
        self._message_done = False
        self._open_calls: dict[int, tuple[int, FunctionCallItem]] = {}  # parser index -> item

    def _next(self) -> int:
        n = self._sequence
        self._sequence += 1
        return n

    def opening(self, *, message: bool = True) -> list[bytes]:
        """`response.created` and `.in_progress`; with `message`, the message opens too."""
        pending = self.draft.response(text=None)
        chunks = [
            self._lifecycle("response.created", pending),
            self._lifecycle("response.in_progress", pending),
        ]
        return chunks + (self._open_message() if message else [])

    def _open_message(self) -> list[bytes]:
        d = self.draft
        self._message_index = index = self._outputs
        self._outputs += 1
        return [
            sse_typed(
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=index,
                    item=d.message(None, "in_progress"),
                ),
                "response.output_item.added",
            ),
            sse_typed(
                ContentPartEvent(
                    type="response.content_part.added",
                    sequence_number=self._next(),
                    item_id=d.item_id,
                    output_index=index,
                    content_index=0,
                    part=OutputText(text=""),
                ),
                "response.content_part.added",
            ),
        ]

    def delta(self, text: str) -> list[bytes]:
        """One `response.output_text.delta` (the message opening first, if it is not)."""
        chunks = self._open_message() if self._message_index is None else []
        assert self._message_index is not None
        self.text += text
        event = OutputTextDeltaEvent(
            sequence_number=self._next(),
            item_id=self.draft.item_id,
            output_index=self._message_index,
            content_index=0,
            delta=text,
        )
        return [*chunks, sse_typed(event, event.type)]

    def call_started(self, index: int, call_id: str, name: str) -> list[bytes]:
        """A function call's item opens (the message, if any, is done first)."""
        chunks = self._close_message("completed")
        item = FunctionCallItem(
            id=f"fc_{call_id.removeprefix('call_')}",
            call_id=call_id,
            name=name,
            arguments="",
            status="in_progress",
        )
        output_index = self._outputs
        self._outputs += 1
        self._open_calls[index] = (output_index, item)
        added = OutputItemEvent(
            type="response.output_item.added",
            sequence_number=self._next(),
            output_index=output_index,
            item=item,
        )
        return [*chunks, sse_typed(added, added.type)]

    def call_arguments(self, index: int, arguments: str) -> list[bytes]:
        """A call's arguments (one delta), then the call is done."""
        output_index, item = self._open_calls.pop(index)
        delta = FunctionCallArgumentsDeltaEvent(
            sequence_number=self._next(),
            item_id=item.id,
            output_index=output_index,
            delta=arguments,
        )
        done = FunctionCallArgumentsDoneEvent(
            sequence_number=self._next(),
            item_id=item.id,
            output_index=output_index,
            name=item.name,
            arguments=arguments,
        )
        finished = item.model_copy(update={"arguments": arguments, "status": "completed"})
        self.calls.append(finished)
        item_done = OutputItemEvent(
            type="response.output_item.done",
            sequence_number=self._next(),
            output_index=output_index,
            item=finished,
        )
        return [sse_typed(e, e.type) for e in (delta, done, item_done)]

    def _close_message(self, status: Status) -> list[bytes]:
        index = self._message_index
        if index is None or self._message_done:
            return []
        self._message_done = True
        d = self.draft
        done = OutputTextDoneEvent(
            sequence_number=self._next(),
            item_id=d.item_id,
            output_index=index,
            content_index=0,
            text=self.text,
        )
        part = ContentPartEvent(
            type="response.content_part.done",
            sequence_number=self._next(),
            item_id=d.item_id,
            output_index=index,
            content_index=0,
            part=OutputText(text=self.text),
        )
        item_done = OutputItemEvent(
            type="response.output_item.done",
            sequence_number=self._next(),
            output_index=index,
            item=d.message(self.text, status),
        )
        return [sse_typed(e, e.type) for e in (done, part, item_done)]

    def closing(self, final: ResponseObject) -> list[bytes]:
        """The message's end (if still open) and the final response (with its usage)."""
        # A turn with no output at all still has its (empty) message.
        empty = self._message_index is None and not self.calls
        chunks = self._open_message() if empty else []
        chunks += self._close_message(final.status)
        end = self._lifecycle(
            "response.completed" if final.status == "completed" else "response.incomplete", final
        )
        return [*chunks, end]

    def error(self, body: dict[str, Any]) -> bytes:
        """The `error` event for an OpenAI error body (gateway.errors.stream_error_body)."""
        detail = body["error"]
        event = StreamErrorEvent(
            sequence_number=self._next(),
            code=detail.get("code"),
            message=detail.get("message") or "the response failed",
            param=detail.get("param"),
        )
        return sse_typed(event, event.type)

    def _lifecycle(self, kind: LifecycleKind, response: ResponseObject) -> bytes:
        event = ResponseLifecycleEvent(type=kind, sequence_number=self._next(), response=response)
        return sse_typed(event, kind)
