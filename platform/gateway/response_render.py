"""Response objects and their typed stream events, from one request's finished or running text.

A stream is, with a `sequence_number` counting from 0 across all of it:

    response.created -> response.in_progress -> response.output_item.added
    -> response.content_part.added -> response.output_text.delta x N
    -> response.output_text.done -> response.content_part.done
    -> response.output_item.done -> response.completed | response.incomplete

(`response.incomplete` when the output budget ran out, as OpenAI sends it), each
as `event: <type>` plus `data: <json>`, with no `[DONE]` after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from gateway.schemas.responses import (
    ContentPartEvent,
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

    def response(
        self,
        *,
        text: str | None,
        finish_reason: str | None = None,
        usage: ResponseUsage | None = None,
        completed_at: int | None = None,
    ) -> ResponseObject:
        """The response object: in progress (text None, no output yet) or finished."""
        status: Status = "in_progress"
        output: list[OutputMessage] = []
        incomplete: IncompleteDetails | None = None
        if text is not None:
            reason = _INCOMPLETE.get(finish_reason or "")
            status = "completed" if reason is None else "incomplete"
            incomplete = None if reason is None else IncompleteDetails(reason=reason)
            output = [self.message(text, status)]
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
        self._sequence = 0

    def _next(self) -> int:
        n = self._sequence
        self._sequence += 1
        return n

    def opening(self) -> list[bytes]:
        """From `response.created` to the empty text part being added."""
        d = self.draft
        pending = d.response(text=None)
        return [
            self._lifecycle("response.created", pending),
            self._lifecycle("response.in_progress", pending),
            sse_typed(
                OutputItemEvent(
                    type="response.output_item.added",
                    sequence_number=self._next(),
                    output_index=0,
                    item=d.message(None, "in_progress"),
                ),
                "response.output_item.added",
            ),
            sse_typed(
                ContentPartEvent(
                    type="response.content_part.added",
                    sequence_number=self._next(),
                    item_id=d.item_id,
                    output_index=0,
                    content_index=0,
                    part=OutputText(text=""),
                ),
                "response.content_part.added",
            ),
        ]

    def delta(self, text: str) -> bytes:
        """One `response.output_text.delta`."""
        self.text += text
        event = OutputTextDeltaEvent(
            sequence_number=self._next(),
            item_id=self.draft.item_id,
            output_index=0,
            content_index=0,
            delta=text,
        )
        return sse_typed(event, event.type)

    def closing(self, final: ResponseObject) -> list[bytes]:
        """From `response.output_text.done` to the final response (with its usage)."""
        d = self.draft
        done = OutputTextDoneEvent(
            sequence_number=self._next(),
            item_id=d.item_id,
            output_index=0,
            content_index=0,
            text=self.text,
        )
        part = ContentPartEvent(
            type="response.content_part.done",
            sequence_number=self._next(),
            item_id=d.item_id,
            output_index=0,
            content_index=0,
            part=OutputText(text=self.text),
        )
        item_done = OutputItemEvent(
            type="response.output_item.done",
            sequence_number=self._next(),
            output_index=0,
            item=final.output[0],
        )
        end = self._lifecycle(
            "response.completed" if final.status == "completed" else "response.incomplete", final
        )
        return [
            sse_typed(done, done.type),
            sse_typed(part, part.type),
            sse_typed(item_done, item_done.type),
            end,
        ]

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
