"""An engine server's LoRA adapter routes: a gateway pushes each adapter as a zip.

    PUT    /internal/adapters/{name}   body: the PEFT folder as a zip; loads (or replaces) it
    DELETE /internal/adapters/{name}   unloads it (409 while requests use it, 404 if unknown)
    GET    /internal/adapters          the loaded adapters

The gateway's registry holds the adapter files; an engine server has no access to them,
so the gateway's `RemoteEngineClient` zips the folder and sends it here. The body is
capped (`max_bytes`, 413 over it) and written to a file as it arrives, then unpacked by
the admin upload's own checks (engine.lora.archive: paths, member types and sizes,
ratio, all before inflating) into a folder of this server's, and loaded through the front's
`load_adapter`, which checks the config, the rank and the shapes (400 with its message).
A push of the files already loaded under that name (several gateways push the same
registry) answers the loaded record without reloading. The folder stays while the
adapter is loaded (the engine may read it again after
evicting the weights from host memory) and is removed once it is replaced or unloaded.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import (
    AdapterInUseError,
    AdapterNotFoundError,
    EngineDeadError,
    InvalidRequestError,
)
from engine.fronts.async_engine import EngineFront
from engine.lora.archive import AdapterArchiveError, ArchiveLimits, extract_members
from engine.lora.peft import CONFIG_FILE, WEIGHTS_FILE, content_digest
from engine.request import check_adapter_name
from engine_server.auth import ServiceAuth
from engine_server.refusals import TOO_LARGE, UNAUTHORIZED, refusal, refusal_of, response_of

MAX_ADAPTER_BYTES = 256 * 1024 * 1024  # a zip of a rank-64 adapter of an 8B model is ~170 MiB
# Unpacked: the two files, each at most 4x the cap (safetensors barely compress).
ADAPTER_LIMITS = ArchiveLimits(
    max_entries=16,
    max_member_bytes=4 * MAX_ADAPTER_BYTES,
    max_total_bytes=4 * MAX_ADAPTER_BYTES,
)


def error(status: int, message: str, *, type_: str, code: str | None = None) -> JSONResponse:
    """An OpenAI error body of a status the adapter routes use alone (404, 409, 501)."""
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def info_to_wire(info: Any) -> dict[str, Any]:
    """An engine front's adapter record (engine.lora.peft.AdapterInfo) as JSON-ready
    values; `location` ("device" or "host") when the front says, else None."""
    location = getattr(info, "location", None)
    return {
        "name": str(info.name),
        "rank": int(info.rank),
        "alpha": float(info.alpha),
        "digest": str(info.digest),
        "target_modules": [str(m) for m in getattr(info, "target_modules", ()) or ()],
        "location": None if location is None else str(location),
    }


class _BodyTooLarge(Exception):
    """The upload went past the cap."""


class AdapterRoutes:
    """The adapter routes over one engine front; adapters are unpacked under `root`."""

    def __init__(
        self,
        front: EngineFront,
        auth: ServiceAuth,
        *,
        parent: Path | None = None,
        max_bytes: int = MAX_ADAPTER_BYTES,
    ) -> None:
        """`root` is a fresh folder in `parent` (None: the system's temp dir), so that
        servers sharing a data dir never share it; `close` removes it."""
        self.front, self.auth, self.max_bytes = front, auth, max_bytes
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="cloister-adapters-", dir=parent))
        self._folders: dict[str, Path] = {}  # adapter -> the folder it was loaded from
        self._lock = asyncio.Lock()  # one load or unload at a time: folders follow the engine

    def routes(self) -> list[Route]:
        """The routes, for the server's Starlette app."""
        return [
            Route("/internal/adapters", self.list_adapters, methods=["GET"]),
            Route("/internal/adapters/{name}", self.put_adapter, methods=["PUT"]),
            Route("/internal/adapters/{name}", self.delete_adapter, methods=["DELETE"]),
        ]

    def close(self) -> None:
        """Removes the unpacked adapters (the engine has stopped)."""
        self._folders.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def _denied(self, request: Request) -> Response | None:
        reason = self.auth.check(request.headers.get("authorization"))
        if reason is None:
            return None
        return response_of(refusal(UNAUTHORIZED, reason))

    def _named(self, request: Request) -> str | Response:
        """The path's adapter name, or the 401/400 that refuses the request."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        name: str = request.path_params["name"]
        try:
            check_adapter_name(name)
        except InvalidRequestError as exc:
            return response_of(refusal_of(exc))
        return name

    def listing(self) -> list[dict[str, Any]]:
        """The front's loaded adapters, as JSON-ready records."""
        return [info_to_wire(a) for a in self.front.adapters()]

    async def list_adapters(self, request: Request) -> Response:
        """GET /internal/adapters."""
        denied = self._denied(request)
        if denied is not None:
            return denied
        return JSONResponse({"adapters": self.listing()})

    async def put_adapter(self, request: Request) -> Response:
        """PUT /internal/adapters/{name}: unpacks the zip body and loads it."""
        name = self._named(request)
        if isinstance(name, Response):
            return name
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return _too_large(self.max_bytes)
        token = uuid.uuid4().hex
        folder, archive = self.root / token, self.root / f"{token}.zip"
        loaded = False
        try:
            await _receive(request.stream(), archive, self.max_bytes)
            await asyncio.to_thread(folder.mkdir)
            digest = await asyncio.to_thread(_unpack, archive, folder)
            async with self._lock:
                same = [a for a in self.listing() if a["name"] == name and a["digest"] == digest]
                if same:  # already loaded with these files (another gateway pushed them)
                    return JSONResponse(same[0])
                info = info_to_wire(await self.front.load_adapter(name, str(folder)))
                replaced = self._folders.get(name)
                self._folders[name] = folder
                loaded = True
            if replaced is not None:
                await asyncio.to_thread(shutil.rmtree, replaced, True)
        except _BodyTooLarge:
            return _too_large(self.max_bytes)
        except InvalidRequestError as exc:  # the engine's InvalidAdapterError, among others
            return response_of(refusal_of(exc))
        except Exception as exc:
            return _engine_refusal(exc)
        finally:
            await asyncio.to_thread(archive.unlink, True)
            if not loaded:
                await asyncio.to_thread(shutil.rmtree, folder, True)
        return JSONResponse(info)

    async def delete_adapter(self, request: Request) -> Response:
        """DELETE /internal/adapters/{name}: unloads it."""
        name = self._named(request)
        if isinstance(name, Response):
            return name
        try:
            async with self._lock:
                await self.front.unload_adapter(name)
                folder = self._folders.pop(name, None)
        except AdapterNotFoundError as exc:
            return error(404, exc.message, type_="invalid_request_error", code=exc.code)
        except InvalidRequestError as exc:
            return response_of(refusal_of(exc))
        except Exception as exc:
            return _engine_refusal(exc)
        if folder is not None:
            await asyncio.to_thread(shutil.rmtree, folder, True)
        return JSONResponse({"unloaded": name})


def _too_large(cap: int) -> JSONResponse:
    return response_of(refusal(TOO_LARGE, f"the adapter archive is over {cap} bytes"))


def _engine_refusal(exc: Exception) -> JSONResponse:
    """The engine's refusals other than bad input: in use (409, the adapter routes' own),
    dead (503, engine_hop.refusals)."""
    if isinstance(exc, AdapterInUseError):
        return error(409, str(exc), type_="invalid_request_error", code="adapter_in_use")
    if isinstance(exc, EngineDeadError):
        return response_of(refusal_of(exc))
    raise exc


async def _receive(chunks: AsyncIterator[bytes], path: Path, cap: int) -> None:
    """Writes the body to `path`, stopping with `_BodyTooLarge` past `cap` bytes (a client
    may lie about, or leave out, its content-length)."""
    out: IO[bytes] = await asyncio.to_thread(path.open, "xb")
    try:
        written = 0
        async for chunk in chunks:
            written += len(chunk)
            if written > cap:
                raise _BodyTooLarge
            await asyncio.to_thread(out.write, chunk)
    finally:
        await asyncio.to_thread(out.close)


def _unpack(archive: Path, folder: Path) -> str:
    """The archive's files, checked, into `folder`; it must hold the PEFT pair. Returns
    their content digest (the one the engine gives the adapter)."""
    names = {p.name for p in extract_members(archive, folder, ADAPTER_LIMITS)}
    if CONFIG_FILE not in names or WEIGHTS_FILE not in names:
        raise AdapterArchiveError(f"the archive needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    return content_digest((folder / WEIGHTS_FILE).read_bytes(), (folder / CONFIG_FILE).read_bytes())
