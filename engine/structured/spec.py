"""What a request's output must match: one small, frozen, picklable value.

The gateway builds it from `response_format`, `guided_*`, `structured_outputs` or a
strict tool, and it travels inside `SamplingParams` through every engine front
(in-process, child process, remote). Compiling it into token masks is the engine's
job (engine.structured.compiler); this module only names and bounds the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.errors import InvalidRequestError

StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "lark"]
KINDS: tuple[StructuredKind, ...] = ("json_schema", "json_object", "regex", "choice", "lark")
# The largest spec taken, in UTF-8 bytes: a grammar's compile time grows with its size,
# and the cache of compiled grammars holds a bounded number of them (CVE-2025-29770).
MAX_SPEC_BYTES = 64 * 1024


class StructuredSpecError(InvalidRequestError):
    """The constraint is malformed or over the size limit (a 400)."""

    code = "invalid_structured_output"


@dataclass(frozen=True)
class StructuredSpec:
    """One output constraint.

    `value` by kind: a JSON Schema as JSON text (`json_schema`); ignored, empty
    (`json_object`: any JSON object); a regular expression (`regex`); a JSON list of
    strings (`choice`); a Lark grammar in llguidance's dialect (`lark`, which may embed
    `%json{...}` schemas, as strict tool calls do).
    """

    kind: StructuredKind
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise StructuredSpecError(
                f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}",
                param="response_format",
            )
        if not isinstance(self.value, str):
            raise StructuredSpecError("the constraint must be text", param="response_format")
        size = len(self.value.encode("utf-8", "surrogatepass"))
        if size > MAX_SPEC_BYTES:
            raise StructuredSpecError(
                f"the constraint is {size} bytes; at most {MAX_SPEC_BYTES} are taken",
                param="response_format",
            )
