"""`/v1/chat/completions` request, response and stream-chunk bodies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.schemas.common import CompletionEnvelope, SamplingFields, Usage


class TextPart(BaseModel):
    """A text content part; other part types (images, audio) are refused by the schema."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    """A call's function: its name and arguments as JSON text."""

    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str


def _is_none(value: Any) -> bool:
    return value is None


# Fields OpenAI only sends when set (it never sends them as null).
def _unset_omitted() -> Any:
    return Field(default=None, exclude_if=_is_none)


class ToolCall(BaseModel):
    """One tool call of an assistant message (in a reply or in the history)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One message of the conversation."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns that called tools
    tool_call_id: str | None = None  # tool turns: the call this is the result of

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id it answers")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def openai_dict(self) -> dict[str, Any]:
        """The message as plain data (content as one string) for the prompt layer."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out

    def text(self) -> str:
        """The message's content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """The body of POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Checked by gateway.tools.schemas.resolve_tools, which words its own 400s.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None


class TopLogprob(BaseModel):
    """One alternative token at a position."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(BaseModel):
    """The chosen token at a position and its alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    """`choices[i].logprobs` of a chat completion."""

    content: list[TokenLogprobEntry] | None


class AssistantMessage(BaseModel):
    """The generated message."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    # A reasoning model's thinking (gateway.reasoning), as vLLM returns it.
    reasoning_content: str | None = _unset_omitted()
    tool_calls: list[ToolCall] | None = _unset_omitted()
    function_call: FunctionCall | None = _unset_omitted()  # the legacy `functions` API


class ChatChoice(BaseModel):
    """One of the `n` completions."""

    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletion(CompletionEnvelope):
    """The non-streaming response."""

    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class FunctionCallDelta(BaseModel):
    """Part of a streamed call's function: the name once, then pieces of the arguments."""

    name: str | None = _unset_omitted()
    arguments: str | None = _unset_omitted()


class ToolCallDelta(BaseModel):
    """Part of a streamed call: index, id and type come in its first delta only."""

    index: int
    id: str | None = _unset_omitted()
    type: Literal["function"] | None = _unset_omitted()
    function: FunctionCallDelta


class ChunkDelta(BaseModel):
    """What a chunk adds to one choice."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = _unset_omitted()
    tool_calls: list[ToolCallDelta] | None = _unset_omitted()
    function_call: FunctionCallDelta | None = _unset_omitted()  # the legacy `functions` API


class ChunkChoice(BaseModel):
    """One choice's part of a stream chunk."""

    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(CompletionEnvelope):
    """One `data:` event of a streaming chat completion."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
