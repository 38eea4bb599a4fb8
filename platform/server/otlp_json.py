"""An OTLP/HTTP span exporter in the protocol's JSON encoding, on the standard library.

OTLP/HTTP carries an `ExportTraceServiceRequest` as protobuf or as JSON
(Content-Type application/json; ids as hex strings, 64-bit integers as strings,
enums as numbers). Collectors accept both. This one needs no protobuf runtime, so
traces work where opentelemetry-exporter-otlp-proto-http is not installed.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

logger = logging.getLogger("cloister.telemetry")
TIMEOUT_S = 10.0


class OtlpJsonSpanExporter(SpanExporter):
    """POSTs each batch of spans to `url` (a collector's .../v1/traces) as OTLP JSON."""

    def __init__(self, url: str, *, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """One POST per batch; a failure is logged and the batch dropped (as the SDK's)."""
        if self._shut or not spans:
            return SpanExportResult.SUCCESS
        body = json.dumps(encode_spans(spans), separators=(",", ":")).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            logger.warning("trace export failed: %s", exc, extra={"url": self.url})
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Later exports are dropped."""
        self._shut = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here (the batch processor holds the spans)."""
        return True


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The ExportTraceServiceRequest of `spans`, grouped by resource and scope."""
    resources: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for span in spans:
        resource_key = id(span.resource)
        _, scopes = resources.setdefault(resource_key, (span.resource, {}))
        scope = span.instrumentation_scope
        scope_key = ("", "") if scope is None else (scope.name, scope.version or "")
        scopes.setdefault(scope_key, []).append(_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": encoded}
                    for (name, version), encoded in scopes.items()
                ],
            }
            for resource, scopes in resources.values()
        ]
    }


def _span(span: ReadableSpan) -> dict[str, Any]:
    context = span.get_span_context()
    assert context is not None, "a finished SDK span has a context"
    encoded: dict[str, Any] = {
        "traceId": format(context.trace_id, "032x"),
        "spanId": format(context.span_id, "016x"),
        "name": span.name,
        "kind": span.kind.value + 1,  # OTLP numbers UNSPECIFIED 0, INTERNAL 1, SERVER 2, ...
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "attributes": _attributes(span.attributes or {}),
        "status": {"code": _STATUS[span.status.status_code]},
    }
    if context.trace_state:
        encoded["traceState"] = context.trace_state.to_header()
    if span.parent is not None and span.parent.is_valid:
        encoded["parentSpanId"] = format(span.parent.span_id, "016x")
    if span.status.description:
        encoded["status"]["message"] = span.status.description
    if span.events:
        encoded["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                "attributes": _attributes(event.attributes or {}),
            }
            for event in span.events
        ]
    return encoded


_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def _attributes(attributes: Any) -> list[dict[str, Any]]:
    return [{"key": str(key), "value": _value(value)} for key, value in attributes.items()]


def _value(value: Any) -> dict[str, Any]:
    # bool before int: a bool is an int in Python.
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, (tuple, list)):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}
