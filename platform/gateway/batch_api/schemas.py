"""The Batch API's JSON shapes, as OpenAI defines them (the openai SDK parses these)."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

MAX_METADATA_PAIRS = 16  # OpenAI's own bounds on `metadata`
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
Listing = TypeVar("Listing", bound=BaseModel)  # FileList or BatchList


class FileObject(BaseModel):
    """A stored file."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    """A page of files."""

    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


def list_page(
    cls: type[Listing], data: list[FileObject] | list[BatchObject], has_more: bool
) -> Listing:
    """A `cls` page of `data`, with the ids at its two ends."""
    first, last = page_ends(data)
    return cls(data=data, first_id=first, last_id=last, has_more=has_more)


def page_ends(data: list[FileObject] | list[BatchObject]) -> tuple[str | None, str | None]:
    """A page's `first_id` and `last_id` (None on an empty page), as OpenAI's lists give."""
    return (data[0].id, data[-1].id) if data else (None, None)


class FileDeleted(BaseModel):
    """The answer to a file deletion."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreateRequest(BaseModel):
    """`POST /v1/batches`."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None

    def checked_metadata(self) -> dict[str, str] | None:
        """The metadata within OpenAI's bounds (ValueError naming the bound otherwise)."""
        if self.metadata is None:
            return None
        if len(self.metadata) > MAX_METADATA_PAIRS:
            raise ValueError(f"metadata holds at most {MAX_METADATA_PAIRS} pairs")
        for key, value in self.metadata.items():
            if "\x00" in key or "\x00" in value:
                raise ValueError("metadata must not hold NUL characters")
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise ValueError(
                    f"metadata keys hold at most {MAX_METADATA_KEY} characters and values"
                    f" {MAX_METADATA_VALUE}"
                )
        return dict(self.metadata)


class RequestCounts(BaseModel):
    """How many lines a batch has, and how many ended well or badly."""

    total: int
    completed: int
    failed: int


class BatchUsage(BaseModel):
    """Tokens the batch's lines consumed so far."""

    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class BatchErrors(BaseModel):
    """Why a batch failed as a whole."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]


class BatchObject(BaseModel):
    """A batch."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, Any] | None = None
    usage: BatchUsage


class BatchList(BaseModel):
    """A page of batches."""

    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
