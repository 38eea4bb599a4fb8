"""One line of a batch input file: parsed and checked against the batch's endpoint.

A line is `{"custom_id": ..., "method": "POST", "url": <the batch's endpoint>,
"body": {...}}`, as OpenAI defines it. A line that breaks these rules does not stop the
batch: it becomes an error-file line with OpenAI's error shape and the others run.
"""

from __future__ import annotations

import json
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
MAX_CUSTOM_ID_CHARS = 512
# The output a line is assumed to ask for when it sets no cap, for the batch token
# budget only (billing counts what ran).
DEFAULT_OUTPUT_ESTIMATE = 1024
_OUTPUT_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


@dataclass(frozen=True)
class LineRequest:
    """A well-formed line: its custom_id and the JSON body to send to the endpoint."""

    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    """Why a line cannot run (the error file's `error` object), and its custom_id if known."""

    custom_id: str | None
    code: str
    message: str


def read_lines(source: Path | IO[bytes]) -> Generator[tuple[int, bytes], None, None]:
    """(line number from 0, bytes) of each non-blank line of a JSONL file or stream (closed
    at the end), read lazily."""
    with source.open("rb") if isinstance(source, Path) else source as stream:
        for number, raw in enumerate(stream):
            if raw.strip():
                yield number, raw


def parse_line(raw: bytes, endpoint: str) -> LineRequest | LineError:
    """The line as a request to `endpoint`, or why it cannot be one."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return LineError(None, "invalid_json_line", "this line is not valid UTF-8 JSON")
    if not isinstance(data, dict):
        return LineError(None, "invalid_json_line", "this line is not a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(None, "missing_custom_id", "custom_id must be a non-empty string")
    if any(c < " " for c in custom_id):
        return LineError(None, "invalid_custom_id", "custom_id holds a control character")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return LineError(
            None, "invalid_custom_id", f"custom_id is longer than {MAX_CUSTOM_ID_CHARS} characters"
        )
    if data.get("method") != "POST":
        return LineError(custom_id, "invalid_method", "method must be 'POST'")
    if data.get("url") != endpoint:
        return LineError(
            custom_id, "invalid_url", f"url must be {endpoint!r}, the batch's endpoint"
        )
    body = data.get("body")
    if not isinstance(body, dict):
        return LineError(custom_id, "invalid_body", "body must be a JSON object")
    if body.get("stream"):
        return LineError(custom_id, "invalid_body", "a batch line cannot stream (stream=true)")
    return LineRequest(custom_id=custom_id, body=body)


@dataclass(frozen=True)
class FileSurvey:
    """What a scan of an input file found: its lines and the tokens they may queue."""

    lines: int
    estimated_tokens: int
    duplicate_custom_ids: frozenset[str]


def estimate_tokens(raw: bytes, body: dict[str, Any] | None) -> int:
    """A line's queued-token estimate: its bytes over 4 plus its output cap."""
    cap = DEFAULT_OUTPUT_ESTIMATE
    if body is not None:
        for name in _OUTPUT_CAPS:
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                cap = value
                break
        n = body.get("n")
        if isinstance(n, int) and not isinstance(n, bool) and n > 1:
            cap *= n
    return len(raw) // 4 + cap


def survey(path: Path | IO[bytes], endpoint: str) -> FileSurvey:
    """Scans an input file once: its runnable and broken lines, the tokens, repeated ids."""
    lines = tokens = 0
    seen: set[str] = set()
    duplicates: set[str] = set()
    for _, raw in read_lines(path):
        lines += 1
        parsed = parse_line(raw, endpoint)
        body = parsed.body if isinstance(parsed, LineRequest) else None
        tokens += estimate_tokens(raw, body)
        if isinstance(parsed, LineRequest):
            if parsed.custom_id in seen:
                duplicates.add(parsed.custom_id)
            seen.add(parsed.custom_id)
    return FileSurvey(lines, tokens, frozenset(duplicates))
