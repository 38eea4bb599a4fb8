"""`/v1/responses` request and response bodies, and the typed events of its stream.

The input items stay plain JSON here: gateway/responses_input.py turns them into
conversation turns and names what it refuses (an item type, a content part), which
a schema-level union could only report as a mismatch.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from gateway.schemas.common import MIN_TOP_P

# OpenAI's metadata limits: 16 pairs, keys up to 64 characters, values up to 512.
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class ResponseCreateRequest(BaseModel):
    """The body of POST /v1/responses. Unknown fields are kept so they can be vetted."""

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=MIN_TOP_P, le=1.0)
    stream: StrictBool = False
    store: StrictBool = True
    previous_response_id: str | None = Field(default=None, max_length=256)
    metadata: dict[MetadataKey, MetadataValue] | None = Field(default=None, max_length=16)
    user: str | None = Field(default=None, max_length=256)
    # SECURITY.md: `cache: false` neither reads nor writes the prefix cache.
    cache: StrictBool = True
    # OpenAI's service tier: "flex" is batch work (engine/scheduler/traffic.py), run in
    # the capacity interactive requests leave; the others are interactive.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    # Function tools (gateway.tools, in the Responses API's flat shape); other tool types
    # and the options below are refused by name (gateway/responses_input.py).
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None

    def extra_fields(self) -> dict[str, Any]:
        """Fields the client sent that this schema does not name."""
        return dict(self.model_extra or {})


class OutputText(BaseModel):
    """The text the model wrote."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The assistant message item of `output`."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    """A call of one of the request's function tools, an item of `output`."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str  # what the caller's `function_call_output` item answers
    name: str
    arguments: str  # JSON text
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = Annotated[OutputMessage | FunctionCallItem, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    """How much of the input came out of the prefix cache."""

    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    """No reasoning model is served here: always 0."""

    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """Token counts of one response."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


def make_response_usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> ResponseUsage:
    """A `ResponseUsage` whose total is always the sum of its parts."""
    return ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
        output_tokens=output_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=input_tokens + output_tokens,
    )


class IncompleteDetails(BaseModel):
    """Why a response stopped before the model finished."""

    reason: Literal["max_output_tokens"]


class TextFormat(BaseModel):
    """`text.format`: plain text is the only format served."""

    type: Literal["text"] = "text"


class TextConfig(BaseModel):
    """`text` as the response echoes it."""

    format: TextFormat = Field(default_factory=TextFormat)


class ResponseObject(BaseModel):
    """A model response (`object: "response"`), as created, streamed and stored."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    completed_at: int | None = None
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = True
    temperature: float | None = None
    text: TextConfig = Field(default_factory=TextConfig)
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[Any] = Field(default_factory=list)
    top_p: float | None = None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class DeletedResponse(BaseModel):
    """The body of DELETE /v1/responses/{id}."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ResponseLifecycleEvent(BaseModel):
    """`response.created`, `.in_progress`, `.completed` and `.incomplete`."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete"
    ]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(BaseModel):
    """`response.output_item.added` and `.done`."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(BaseModel):
    """`response.content_part.added` and `.done`."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDeltaEvent(BaseModel):
    """`response.output_text.delta`: a piece of text."""

    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDoneEvent(BaseModel):
    """`response.output_text.done`: the whole text of the part."""

    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class FunctionCallArgumentsDeltaEvent(BaseModel):
    """`response.function_call_arguments.delta`: a piece of a call's arguments."""

    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDoneEvent(BaseModel):
    """`response.function_call_arguments.done`: a call's whole arguments."""

    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class StreamErrorEvent(BaseModel):
    """`error`: the stream failed after its 200 went out."""

    type: Literal["error"] = "error"
    sequence_number: int
    code: str | None
    message: str
    param: str | None
