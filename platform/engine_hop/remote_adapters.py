"""LoRA adapters on an engine server: the client side of engine_server.adapters.

The gateway's registry holds each adapter's PEFT folder; `push_adapter` zips it (its
regular files, stored: safetensors barely compress) and PUTs it to the engine server,
`remove_adapter` DELETEs it. The server's answers map back to the errors an in-process
engine raises: a rejected adapter (400, or 413 for an archive over the server's cap) is
the engine's own `InvalidRequestError` (`InvalidAdapterError` and the like) with its
message, code and param, read by the hop's refusal table (engine_hop.refusals, as
engine_hop.remote_errors reads a request's refusal); an adapter in use is an
`AdapterInUseError`, an unknown one an `AdapterNotFoundError`; anything else
(unreachable, a 5xx) is an `AdapterPushError` (an `EngineDeadError`).
"""

from __future__ import annotations

import asyncio
import io
import json
import urllib.parse
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from engine.errors import AdapterNotFoundError, EngineDeadError, InvalidRequestError
from engine_hop.adapters import AdapterInfo, AdapterInUseError
from engine_hop.refusals import BAD_REQUEST, TOO_LARGE, error_of
from engine_hop.remote_errors import refusal_of_response

# The engine server's cap (engine_server.adapters.MAX_ADAPTER_BYTES) is checked there;
# a folder over it is refused here before anything is sent.
MAX_PUSH_BYTES = 256 * 1024 * 1024


class AdapterPushError(EngineDeadError):
    """The engine server could not be reached, or failed, for an adapter call."""


def zip_folder(path: str) -> bytes:
    """The regular files directly in the folder at `path`, as a zip (no folders, no
    links: the engine server refuses them)."""
    folder = Path(path)
    if not folder.is_dir():
        raise InvalidRequestError(f"adapter folder {path} is not a folder")
    buffer = io.BytesIO()
    total = 0
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for file in sorted(folder.iterdir()):
            if file.is_symlink() or not file.is_file():
                continue
            total += file.stat().st_size
            if total > MAX_PUSH_BYTES:
                raise InvalidRequestError(f"adapter folder {path} is over {MAX_PUSH_BYTES} bytes")
            archive.write(file, arcname=file.name)
    return buffer.getvalue()


def info_from_wire(data: Any) -> AdapterInfo:
    """An adapter's record as an engine server sent it (engine_server.adapters.info_to_wire;
    KeyError, ValueError or TypeError when malformed)."""
    location = data.get("location")
    return AdapterInfo(
        name=str(data["name"]),
        rank=int(data["rank"]),
        alpha=float(data["alpha"]),
        digest=str(data["digest"]),
        target_modules=tuple(str(m) for m in data.get("target_modules") or ()),
        location=None if location is None else str(location),
    )


def _url(name: str) -> str:
    return "/internal/adapters/" + urllib.parse.quote(name, safe="")


def _message(response: httpx.Response) -> str:
    try:
        return str(json.loads(response.content)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def _refusal(base_url: str, response: httpx.Response) -> Exception:
    status = response.status_code
    if status in (BAD_REQUEST.status, TOO_LARGE.status):
        # The caller's: a bad adapter (400) or archive (413), read by the hop's table as
        # the engine's own bad request, with its code and param.
        refused = refusal_of_response(status, response.content, response.headers)
        return error_of(replace(refused, status=BAD_REQUEST.status))
    message = _message(response)
    if status == 409:
        return AdapterInUseError(message)
    if status == 404:
        return AdapterNotFoundError(message)
    return AdapterPushError(f"engine server {base_url} answered {status}: {message}")


async def push_adapter(
    http: httpx.AsyncClient, base_url: str, headers: dict[str, str], name: str, path: str
) -> AdapterInfo:
    """Zips the folder at `path` (on a worker thread) and loads it on the server as `name`."""
    body = await asyncio.to_thread(zip_folder, path)
    try:
        response = await http.put(
            _url(name),
            content=body,
            headers={**headers, "content-type": "application/zip"},
        )
    except httpx.HTTPError as exc:
        raise AdapterPushError(f"engine server {base_url}: {exc}") from None
    if response.status_code != 200:
        raise _refusal(base_url, response)
    try:
        return info_from_wire(response.json())
    except (ValueError, KeyError, TypeError) as exc:
        raise AdapterPushError(f"engine server {base_url} sent a bad adapter record") from exc


async def remove_adapter(
    http: httpx.AsyncClient, base_url: str, headers: dict[str, str], name: str
) -> None:
    """Unloads `name` on the server."""
    try:
        response = await http.delete(_url(name), headers=headers)
    except httpx.HTTPError as exc:
        raise AdapterPushError(f"engine server {base_url}: {exc}") from None
    if response.status_code != 200:
        raise _refusal(base_url, response)


def adapters_from_stats(stats: dict[str, Any]) -> list[AdapterInfo] | None:
    """The loaded adapters a stats poll carried (None: an older server that sends none)."""
    raw = stats.get("adapters")
    if raw is None:
        return None
    return [info_from_wire(a) for a in raw]
