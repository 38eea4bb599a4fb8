"""LoRA adapters on an engine server: the client side of engine_server.adapters.

The gateway's registry holds each adapter's PEFT folder; `push_adapter` zips it (its
regular files, stored: safetensors barely compress) and PUTs it to the engine server,
`remove_adapter` DELETEs it. The server's answers map back to the errors an in-process
engine raises: a rejected adapter is an `InvalidRequestError` with the engine's
message, an adapter in use an `AdapterInUseError`, an unknown one an
`AdapterNotFoundError`; anything else (unreachable, a 5xx) is `EngineUnavailableError`.
"""

from __future__ import annotations

import asyncio
import io
import json
import urllib.parse
import zipfile
from pathlib import Path
from typing import Any

import httpx

from engine.errors import AdapterNotFoundError, EngineDeadError, InvalidRequestError
from gateway.adapters import AdapterInfo, AdapterInUseError

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
    message = _message(response)
    if response.status_code in (400, 413):
        return InvalidRequestError(message)
    if response.status_code == 409:
        return AdapterInUseError(message)
    if response.status_code == 404:
        return AdapterNotFoundError(message)
    return AdapterPushError(f"engine server {base_url} answered {response.status_code}: {message}")


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
