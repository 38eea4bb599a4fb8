"""A readable page of an OpenAPI document, rendered on the server: no script, no CDN.

FastAPI's `get_swagger_ui_html` loads Swagger UI's script and styles from a CDN
(cdn.jsdelivr.net), so its page is blank on a host without internet access, which
is where many inference servers run. This page needs nothing but the document:
each operation with its summary, parameters, body and responses, then each schema's
fields. Tools read the JSON document itself (its URL is linked at the top).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from starlette.responses import HTMLResponse

METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
# Nothing to load and no script to run: the page is plain HTML with inline styles.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "Cache-Control": "no-store",
}
_STYLE = (
    "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;padding:0 1em}"
    "h2{border-bottom:1px solid #ccc;margin-top:2em}code,.m{font-family:ui-monospace,monospace}"
    ".op{border:1px solid #ddd;border-radius:4px;margin:.7em 0;padding:.5em .8em}"
    ".m{font-weight:bold;text-transform:uppercase;margin-right:.6em}"
    "table{border-collapse:collapse}td,th{border-bottom:1px solid #eee;padding:2px 8px;"
    "text-align:left;vertical-align:top}"
)


def _ref_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        return f'<a href="#schema-{escape(name)}">{escape(name)}</a>'
    return f"<code>{escape(json.dumps(schema, separators=(',', ':'))[:200])}</code>"


def _operation(path: str, method: str, op: dict[str, Any]) -> str:
    parts = [
        f'<div class="op"><span class="m">{method}</span><code>{escape(path)}</code>',
        f"<p>{escape(str(op.get('summary', '')))}</p>",
    ]
    security = [name for item in op.get("security", []) for name in item]
    if security:
        parts.append(f"<p>Credential: {escape(', '.join(security))}</p>")
    params = op.get("parameters", [])
    if params:
        rows = "".join(
            f"<tr><td><code>{escape(str(p.get('name')))}</code></td>"
            f"<td>{escape(str(p.get('in')))}</td><td>{_ref_name(p.get('schema', {}))}</td>"
            f"<td>{escape(str(p.get('description', '')))}</td></tr>"
            for p in params
        )
        parts.append(
            f"<table><tr><th>parameter</th><th>in</th><th>schema</th><th></th></tr>{rows}</table>"
        )
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        parts.append(f"<p>Body ({escape(media)}): {_ref_name(content.get('schema', {}))}</p>")
    rows = "".join(
        f"<tr><td>{escape(str(status))}</td><td>{escape(str(r.get('description', '')))}</td></tr>"
        for status, r in sorted(op.get("responses", {}).items())
    )
    parts.append(f"<table><tr><th>status</th><th>response</th></tr>{rows}</table></div>")
    return "".join(parts)


def _schema(name: str, schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = "".join(
        f"<tr><td><code>{escape(field)}</code>{' *' if field in required else ''}</td>"
        f"<td>{_ref_name(spec)}</td><td>{escape(str(spec.get('description', '')))}</td></tr>"
        for field, spec in schema.get("properties", {}).items()
    )
    title = f'<h3 id="schema-{escape(name)}">{escape(name)}</h3>'
    about = escape(str(schema.get("description", "")))
    return f"{title}<p>{about}</p><table>{rows}</table>" if rows else f"{title}<p>{about}</p>"


def render_docs(document: dict[str, Any], openapi_url: str) -> str:
    """The HTML page of `document`, linking to its JSON at `openapi_url`."""
    info = document.get("info", {})
    title = escape(str(info.get("title", "API")))
    ops = "".join(
        _operation(path, method, item[method])
        for path, item in document.get("paths", {}).items()
        for method in METHODS
        if method in item
    )
    schemas = "".join(
        _schema(name, spec)
        for name, spec in sorted(document.get("components", {}).get("schemas", {}).items())
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{title}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
        f"<p>OpenAPI {escape(str(document.get('openapi', '')))} document: "
        f'<a href="{escape(openapi_url)}">{escape(openapi_url)}</a></p>'
        f"<h2>Operations</h2>{ops}<h2>Schemas</h2>{schemas}</body></html>"
    )


def docs_response(document: dict[str, Any], openapi_url: str) -> HTMLResponse:
    """`render_docs` as a response that may load nothing from anywhere."""
    return HTMLResponse(render_docs(document, openapi_url), headers=PAGE_HEADERS)
