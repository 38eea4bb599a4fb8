"""`RemoteEngineClient`: the `EngineClient` of an engine server (`cloister engine serve`).

Requests go out as the wire format of engine_hop.wire, with the service token,
and their chunks come back as the `StreamEvent`s an in-process engine would give.
They travel over the link (one WebSocket for all of them, engine_hop.link_client) or,
with `transport="http"`, as one HTTP request each. A request is sent as soon as it is
submitted (not when its stream is first read), with the W3C trace context
(traceparent) of the span current at submit. Closing a stream, or `abort`, stops
the request on the engine server, which frees its KV blocks at once. A stream's
`admitted` returns once the engine server took the request and raises its refusal
(the engine's own error), so the gateway answers a refused request as it answers one
its in-process engine refused at submit: over HTTP, the 200's status line says it
(sent at admission, engine_hop.wire), over the link the accepted frame.

`stats()` and `alive` must answer without I/O, so a background task polls the
server's /internal/stats every `poll_s`; a server that fails `max_failures` polls in
a row is not alive until it answers again. The same goes for `adapters()`: the poll
carries the server's loaded LoRA adapters (pushed by engine_hop.remote_adapters), and the
first poll that answers (again, after failures) re-reads /internal/info, so that a
replica reports its own device and dtype, even after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import httpx
import orjson

from engine.errors import (
    AdapterNotFoundError,
    EngineDeadError,
)
from engine.kv_cache.cache_rules import CacheRules
from engine.kv_cache.host_tier import TierStats
from engine.queued_stream import QueuedStream
from engine.request import EngineRequest
from engine.structured.compiler import GrammarCompiler
from engine.structured.spec import StructuredSpec
from engine_hop.adapters import AdapterInfo
from engine_hop.client import EngineSnapshot, TokenizerLike
from engine_hop.link_client import READ_TIMEOUT_S, EngineLink, LinkStream
from engine_hop.remote_adapters import adapters_from_stats, push_adapter, remove_adapter
from engine_hop.remote_errors import Admission, EngineUnavailableError, error_of_response
from engine_hop.replicas import ReplicaState
from engine_hop.stats_json import spec_decode_from_json, tenant_kv_from_json
from engine_hop.trace import trace_headers
from engine_hop.wire import (
    EVENTS_WIRE,
    WIRE_HEADER,
    event_from_compact,
    request_to_wire,
    rules_to_wire,
)

logger = logging.getLogger("cloister.gateway.remote")
Transport = Literal["link", "http"]
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class EngineServerInfo:
    """What an engine server says of itself (GET /internal/info)."""

    model_name: str
    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    device: str | None = None  # None: the server does not say (an older one)
    dtype: str | None = None
    max_loras: int = 0


def info_from_json(data: dict[str, Any]) -> EngineServerInfo:
    """The info an engine server answered (KeyError/ValueError when malformed)."""
    device, dtype = data.get("device"), data.get("dtype")
    return EngineServerInfo(
        model_name=str(data["model_name"]),
        max_model_len=int(data["max_model_len"]),
        vocab_size=int(data["vocab_size"]),
        num_blocks=int(data["num_blocks"]),
        block_size=int(data["block_size"]),
        device=None if device is None else str(device),
        dtype=None if dtype is None else str(dtype),
        max_loras=int(data.get("max_loras") or 0),
    )


def fetch_info(base_url: str, token: str | None, *, wait_s: float = 0.0) -> EngineServerInfo:
    """The server's info; retries for up to `wait_s` while the server is starting."""
    return first_info(lambda: [base_url], token, wait_s=wait_s, described=base_url)[1]


def first_info(
    candidates: Callable[[], Sequence[str]],
    token: str | None,
    *,
    wait_s: float,
    described: str,
) -> tuple[str, EngineServerInfo]:
    """(URL, info) of the first engine server among `candidates()` that answers. While
    none does, asks again every half second for up to `wait_s`, calling `candidates`
    each round (so that DNS names are resolved again), and says once, as a warning,
    that it waits: a gateway started before its engines, or with one of them down,
    starts with those that answer. A refused credential fails at once."""
    deadline = time.monotonic() + wait_s
    headers = _auth(token)
    said_waiting = False
    while True:
        failures = []
        for url in candidates():
            try:
                return url, _info_of(url, headers)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                failures.append(f"{url}: {exc or type(exc).__name__}")
        why = "; ".join(failures) or "no address resolves yet"
        if time.monotonic() >= deadline:
            raise EngineUnavailableError(f"no engine server answered at {described} ({why})")
        if not said_waiting:
            logger.warning(
                "waiting up to %.0f s for an engine server at %s (%s)", wait_s, described, why
            )
            said_waiting = True
        time.sleep(0.5)


def _info_of(base_url: str, headers: dict[str, str]) -> EngineServerInfo:
    response = httpx.get(f"{base_url}/internal/info", headers=headers, timeout=5.0)
    if response.status_code == 401:
        raise EngineUnavailableError(
            f"{base_url} refused the service credential (CLOISTER_SERVICE_TOKEN)"
        )
    response.raise_for_status()
    return info_from_json(response.json())


def local_grammar_checker(tokenizer: TokenizerLike, vocab_size: int) -> GrammarCompiler:
    """A compiler on the gateway's copy of the tokenizer: it checks constraints before
    admission (the engine server compiles its own, off its step loop)."""
    eos = sorted(tokenizer.eos_token_ids)
    return GrammarCompiler(tokenizer, vocab_size=vocab_size, eos_token_ids=eos)


def _auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


class RemoteStream(QueuedStream):
    """The events of one request on an engine server; iterate it, or `aclose` it."""

    def __init__(self, client: RemoteEngineClient, request: EngineRequest) -> None:
        super().__init__(request.request_id, request.prompt_token_ids)
        self._client = client
        # Read now, in the caller's context (the gateway's request span is current there).
        self._trace_headers = trace_headers()
        self._admission = Admission()
        self._task = asyncio.get_running_loop().create_task(self._run(request))

    async def admitted(self) -> None:
        """Returns once the engine server admitted the request (its 200); raises its
        refusal (the engine's error) or the failure to reach it."""
        await self._admission.wait()

    def _fail(self, error: BaseException) -> None:
        """Ends the stream with `error` (the refusal, if the server had not admitted it)."""
        self._admission.note(error)
        self.put(error)

    async def _run(self, request: EngineRequest) -> None:
        body, headers = request_to_wire(request, self._client.model_name)
        headers.update(self._client.auth_headers)
        headers.update(self._trace_headers)
        headers.update(_STREAM_HEADERS)
        try:
            session = self._client.stream_session()
            async with session.post(
                self._client.completions_url, data=orjson.dumps(body), headers=headers
            ) as response:
                if response.status != 200:
                    error = error_of_response(
                        response.status, await response.read(), response.headers
                    )
                    self._fail(error)
                    return
                self._admission.accept()
                await self._read(response.content)
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, TimeoutError, _MalformedChunkError) as exc:
            self._client.note_failure()
            self._fail(EngineUnavailableError(f"engine server: {exc!r}"))
        except Exception as exc:
            self._fail(exc)
        finally:
            # Cancelled (closed) or ended without a word: not admitted, to a waiter.
            self._admission.note(EngineUnavailableError("the engine server ended the stream"))
            # Read only if nothing ended the stream before (a last event, an error).
            self.put(EngineUnavailableError("the engine server ended the stream early"))

    async def _read(self, body: aiohttp.StreamReader) -> None:
        """Queues each compact event of the body as it arrives (chunks are `data: ...`
        frames ended by a blank line; a read may hold several, or part of one)."""
        pending = b""
        put = self.put
        async for piece in body.iter_any():
            *frames, pending = (pending + piece).split(b"\n\n")
            for frame in frames:
                if frame == b"data: [DONE]" or not frame.startswith(b"data: "):
                    continue
                try:
                    chunk = orjson.loads(frame[6:])
                    if "error" in chunk:
                        message = str(chunk["error"].get("message", "engine error"))
                        put(EngineDeadError(message))
                        continue
                    put(event_from_compact(self.request_id, chunk, self.prompt))
                except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
                    raise _MalformedChunkError(f"a malformed chunk: {exc!r}") from None
        # No break on the last event, nor on [DONE]: reading the body to its end (it ends
        # right after them) returns the connection to the pool. A response left unread is
        # closed, and the next request pays a connect.

    async def aclose(self) -> None:
        """Hangs up: the engine server aborts the request."""
        self.done = True
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class _MalformedChunkError(Exception):
    """A chunk that is not what an engine server sends."""


# The compact chunks (engine_hop.wire); the body is JSON, encoded here by orjson.
_STREAM_HEADERS = {WIRE_HEADER: EVENTS_WIRE, "content-type": "application/json"}


class RemoteEngineClient:
    """An `EngineClient` over one engine server."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        tokenizer: TokenizerLike,
        info: EngineServerInfo,
        model_name: str | None = None,
        poll_s: float = 1.0,
        max_failures: int = 3,
        request_timeout_s: float = READ_TIMEOUT_S,
        transport: Transport = "link",
    ) -> None:
        """`transport`: "link" sends completions over one WebSocket (engine_hop.link_client),
        "http" one HTTP request each (for a Kubernetes Gateway in front of an
        InferencePool, whose endpoint picker chooses a replica per request)."""
        self.base_url = base_url.rstrip("/")
        self.model_name: str = model_name or info.model_name
        self.max_model_len: int = info.max_model_len
        self.vocab_size: int = info.vocab_size
        self.info = info
        self.auth_headers = _auth(token)
        self._tokenizer = tokenizer
        self._poll_s, self._max_failures = poll_s, max_failures
        self._timeout = httpx.Timeout(request_timeout_s, connect=CONNECT_TIMEOUT_S)
        self.http = httpx.AsyncClient(base_url=self.base_url, timeout=self._timeout)
        # Completions go through aiohttp (a fraction of httpx's cost per request and per
        # chunk); control calls through `http`. The session is made in the running loop.
        self._stream_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=request_timeout_s
        )
        self._stream_session: aiohttp.ClientSession | None = None
        # Absolute: a base URL with a path is fine here, unlike as aiohttp's base_url.
        self.completions_url = f"{self.base_url}/v1/completions"
        self._snapshot = EngineSnapshot(0, 0, 0.0, 0, 0, 0)
        self._failures = 0
        self._draining = False
        self._closed = False
        self._poller: asyncio.Task[None] | None = None
        self._streams: dict[str, RemoteStream] = {}
        self._grammars = local_grammar_checker(tokenizer, info.vocab_size)
        self._adapters: dict[str, AdapterInfo] = {}
        # Bumped by each load and unload: a poll sent before one must not undo its result.
        self._adapter_changes = 0
        self._info_current = False  # /internal/info read since the server last answered
        self.transport: Transport = transport
        self._link = EngineLink(
            self.base_url,
            headers=self.auth_headers,
            session=self.stream_session,
            on_failure=self.note_failure,
            on_draining=self._note_draining,
            read_timeout_s=request_timeout_s,
        )

    def stream_session(self) -> aiohttp.ClientSession:
        """The completions' connection pool (keep-alive), made on first use in the running
        loop, which aiohttp binds it to."""
        if self._stream_session is None:
            self._stream_session = aiohttp.ClientSession(
                timeout=self._stream_timeout, auto_decompress=False
            )
        return self._stream_session

    @property
    def tokenizer(self) -> TokenizerLike:
        """The served model's tokenizer, loaded by the gateway from the same model."""
        return self._tokenizer

    def submit(self, request: EngineRequest) -> RemoteStream | LinkStream:
        """Sends the request now and returns its stream at once; the server's admission or
        refusal (400, overload, an unreachable server) is the stream's `admitted`, and a
        refusal is also the stream's first item."""
        if self._closed:
            raise EngineDeadError("the engine client was shut down")
        if self.transport == "link":
            return self._link.open(request, self.model_name, trace_headers())
        stream = RemoteStream(self, request)
        self._streams[request.request_id] = stream
        stream._task.add_done_callback(lambda _t: self._streams.pop(request.request_id, None))
        return stream

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Checks `spec` compiles (a `StructuredSpecError`, a 400, if not), on a worker."""
        await self._grammars.prepare(spec, cache_domain)

    async def abort(self, request_id: str) -> None:
        """Hangs up on the request and tells the server, in case the hang-up is missed."""
        if self.transport == "link":
            await self._link.abort(request_id)  # the frame goes on the link, in order
            return
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            await stream.aclose()
        with contextlib.suppress(httpx.HTTPError):
            await self.http.post(
                "/internal/abort", json={"request_id": request_id}, headers=self.auth_headers
            )

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """PUT /internal/cache_rules; an unreachable server raises `EngineDeadError`."""
        try:
            response = await self.http.put(
                "/internal/cache_rules", json=rules_to_wire(rules), headers=self.auth_headers
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"engine server {self.base_url}: {exc}") from None
        if response.status_code != 200:
            raise EngineUnavailableError(
                f"engine server {self.base_url} refused the cache rules: {response.text[:200]}"
            )

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Zips the PEFT folder at `path` and loads it on the server as `name`."""
        self._adapter_changes += 1
        try:
            info = await push_adapter(self.http, self.base_url, self.auth_headers, name, path)
        finally:
            self._adapter_changes += 1  # polls sent while it ran may predate it too
        self._adapters[name] = info
        return info

    async def unload_adapter(self, name: str) -> None:
        """Unloads `name` on the server (`AdapterInUseError` while requests use it)."""
        self._adapter_changes += 1
        try:
            await remove_adapter(self.http, self.base_url, self.auth_headers, name)
        except AdapterNotFoundError:
            self._adapters.pop(name, None)  # not there (it restarted): not listed either
            raise
        finally:
            self._adapter_changes += 1
        self._adapters.pop(name, None)

    def adapters(self) -> list[AdapterInfo]:
        """The adapters loaded on the server, as of the last poll, load or unload."""
        return [self._adapters[name] for name in sorted(self._adapters)]

    def has_adapter(self, name: str) -> bool:
        """Whether `adapters()` lists `name` (no I/O; a replica set routes by it)."""
        return name in self._adapters

    def stats(self) -> EngineSnapshot:
        """The last polled figures."""
        return self._snapshot

    def replica_state(self, in_flight: int | None = None) -> ReplicaState:
        """This engine server as the console shows it; `in_flight`: this gateway's
        requests streaming from it now, where a replica set counts them."""
        # The stats poll carries load only; the pool's shape came with /internal/info
        # (re-read from each replica, so current).
        info = self.info
        snap = dataclasses.replace(
            self.stats(), num_blocks=info.num_blocks, block_size=info.block_size
        )
        return ReplicaState(
            self.base_url,
            self.alive,
            snap,
            in_process=False,
            device=info.device,
            dtype=info.dtype,
            in_flight=in_flight,
        )

    def replica_states(self) -> list[ReplicaState]:
        """The one engine server."""
        return [self.replica_state()]

    @property
    def alive(self) -> bool:
        """False after `max_failures` failed polls in a row, while draining, or once shut."""
        return not self._closed and not self._draining and self._failures < self._max_failures

    def note_failure(self) -> None:
        """A request could not reach the server: counts as a failed poll."""
        self._failures += 1

    def _note_draining(self) -> None:
        """The server said, over the link, that it admits nothing new (the next poll that
        says otherwise, after a restart, clears it)."""
        self._draining = True

    async def start(self) -> None:
        """Starts the stats poller (idempotent)."""
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def shutdown(self) -> None:
        """Stops polling and closes the connections; the engine server keeps running."""
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        for stream in list(self._streams.values()):
            await stream.aclose()
        await self._link.close()
        await self.http.aclose()
        if self._stream_session is not None:
            await self._stream_session.close()
        self._grammars.shutdown()

    async def poll_once(self) -> None:
        """One stats poll (and, when it answers after a failure, one info read)."""
        changes = self._adapter_changes
        try:
            response = await self.http.get(
                "/internal/stats", headers=self.auth_headers, timeout=self._poll_s * 2 + 1
            )
            response.raise_for_status()
            s: dict[str, Any] = response.json()
            self._snapshot = EngineSnapshot(
                num_running=int(s["num_running"]),
                num_waiting=int(s["num_waiting"]),
                kv_cache_usage=float(s["kv_cache_usage"]),
                prefix_cache_queries=int(s["prefix_cache_queries"]),
                prefix_cache_hits=int(s["prefix_cache_hits"]),
                num_preemptions=int(s["num_preemptions"]),
                max_loras=int(s.get("max_loras") or 0),
                running_adapters=_adapter_names(s.get("lora_running")),
                waiting_adapters=_adapter_names(s.get("lora_waiting")),
                prefill_token_cap=_optional_int(s.get("prefill_token_cap")),
                tenant_kv=tenant_kv_from_json(s.get("tenant_kv")),
                num_batch_running=int(s.get("num_batch_running") or 0),
                num_batch_waiting=int(s.get("num_batch_waiting") or 0),
                kv_tiers=_tiers_from_json(s.get("kv_tiers")),
                spec_decode=spec_decode_from_json(s.get("spec_decode")),
                num_overlapped_steps=int(s.get("num_overlapped_steps") or 0),
                num_synchronous_steps=int(s.get("num_synchronous_steps") or 0),
            )
            adapters = adapters_from_stats(s)
            if adapters is not None and changes == self._adapter_changes:
                self._adapters = {a.name: a for a in adapters}
            self._draining = bool(s.get("draining"))
            self._failures = 0
            if not self._info_current:
                await self._read_info()
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            self._failures += 1
            self._info_current = False

    async def _read_info(self) -> None:
        """Re-reads /internal/info: this replica's own device and dtype (a replica set
        builds its clients with the first replica's info)."""
        response = await self.http.get("/internal/info", headers=self.auth_headers)
        response.raise_for_status()
        self.info = info_from_json(response.json())
        self._info_current = True

    async def _poll(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self._poll_s)


def _adapter_names(value: Any) -> tuple[str, ...] | None:
    """Adapter names with sequences, from a stats poll's name -> count (None: not sent)."""
    if not isinstance(value, dict):
        return None
    return tuple(sorted(str(name) for name, count in value.items() if count))


def _optional_int(value: Any) -> int | None:
    """An integer a stats poll may leave out or send as null."""
    return None if value is None else int(value)


def _tiers_from_json(raw: object) -> tuple[TierStats, ...]:
    """The KV tiers of an engine's /internal/stats; an entry this gateway cannot read (an
    engine of another version) is left out rather than failing the whole poll."""
    if not isinstance(raw, list):
        return ()
    names = {f.name for f in dataclasses.fields(TierStats)}
    # Fields with a default (the transfer times) may be missing from an older engine.
    required = {f.name for f in dataclasses.fields(TierStats) if f.default is dataclasses.MISSING}
    tiers: list[TierStats] = []
    for entry in raw:
        if not isinstance(entry, dict) or not required <= entry.keys():
            continue
        try:
            tiers.append(TierStats(**{k: entry[k] for k in names & entry.keys()}))
        except (TypeError, ValueError):
            continue
    return tuple(tiers)
