"""An engine's refusal reads the same to a tenant whichever way the engine is reached.

The in-process engine is the reference: what the gateway answers a tenant for an engine
error raised in its own process is what it must answer when an engine server refused
the same request over HTTP or over the link. And the engine server itself speaks the
same OpenAI `type`, `code` and `param` on both transports (engine_hop.refusals).

Two layers: every refusal the engine server sends, encoded by the server and read
back by the gateway on each transport (fast, no sockets); then live, a real engine (the
fast fake model) behind an in-thread engine server and three gateways, in-process,
remote over HTTP and remote over the link. An adapter push the engine server refuses
(engine_hop.remote_adapters) keeps its code and param the same way, in both layers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from engine.errors import (
    AdapterNotFoundError,
    ContextLengthExceededError,
    EngineDeadError,
    EngineOverloadedError,
    InvalidAdapterError,
    InvalidRequestError,
    KVQuotaExceededError,
    RequestTooLargeError,
)
from engine.fronts.async_engine import AsyncEngine
from engine.lora.archive import AdapterArchiveError
from engine_hop import refusals as hop
from engine_hop.remote_adapters import push_adapter
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_hop.remote_errors import error_of_frame, error_of_response
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from engine_server.refusals import refusal_of, response_of
from gateway.errors import install_error_handlers
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.engine_servers import gateway_over, serve_in_thread
from tests.utils.fast_fake_model import fast_fake_engine, fast_fake_llm_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

TOKEN = "svc-" + "refusals-token-for-tests-only"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TRANSPORTS = ("http", "link")

# Every refusal an engine server sends for a request it will not run.
REFUSED = [
    InvalidRequestError("temperature must be in [0, 2], got 9", param="temperature"),
    InvalidRequestError("the body is not JSON"),  # no param, no code of its own
    ContextLengthExceededError("the prompt and max_tokens overflow", param="max_tokens"),
    RequestTooLargeError("more KV than the whole cache", param="max_tokens"),
    KVQuotaExceededError("over the tenant's KV quota", param="max_tokens"),
    AdapterNotFoundError("adapter 'x' is not loaded", param="adapter"),
    EngineOverloadedError("the waiting queue is full (4 requests)", retry_after_s=2.0),
    EngineDeadError("the engine loop stopped"),
]


def tenant_answer(exc: BaseException) -> tuple[int, dict[str, Any], str | None]:
    """(status, error body, Retry-After) the gateway's handlers give a tenant for `exc`."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raise")
    async def _raise() -> None:
        raise exc

    response = TestClient(app, raise_server_exceptions=False).get("/raise")
    return response.status_code, response.json()["error"], response.headers.get("retry-after")


def over_http(exc: InvalidRequestError | EngineOverloadedError | EngineDeadError) -> Exception:
    """What the gateway reads from the engine server's HTTP refusal of `exc`."""
    response = response_of(refusal_of(exc))
    return error_of_response(response.status_code, bytes(response.body), response.headers)


def over_link(exc: InvalidRequestError | EngineOverloadedError | EngineDeadError) -> Exception:
    """What the gateway reads from the engine server's link refusal frame of `exc`."""
    frame = orjson.loads(orjson.dumps({"id": "r", "x": refusal_of(exc).fields()}))
    return error_of_frame(frame["x"])


@pytest.mark.parametrize("exc", REFUSED, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("read", [over_http, over_link], ids=TRANSPORTS)
def test_every_refusal_reads_back_as_the_in_process_error(
    exc: Any, read: Callable[[Any], Exception]
) -> None:
    assert tenant_answer(read(exc)) == tenant_answer(exc)


@pytest.mark.parametrize("exc", REFUSED, ids=lambda e: type(e).__name__)
def test_the_engine_server_says_one_type_code_and_param_on_both_transports(exc: Any) -> None:
    status, tenant, _ = tenant_answer(exc)
    refusal = refusal_of(exc)
    response = response_of(refusal)
    http = orjson.loads(response.body)["error"]
    frame = refusal.fields()
    assert response.status_code == frame["status"] == status
    for field in ("type", "code", "param"):
        assert http[field] == frame[field] == tenant[field], field


# An adapter push the engine server turns away (engine_server.adapters answers the
# engine's bad-adapter errors from the same table): read back with code and param.
ADAPTER_REFUSED = [
    InvalidAdapterError("adapter_config.json is not JSON", param="path"),
    InvalidAdapterError("only plain LoRA adapters run here, not IA3"),  # no param
    AdapterArchiveError("unsafe path in archive: '../evil'"),
    InvalidRequestError("adapter names are at most 64 characters", param="name"),
]


def adapter_folder(root: Path, config: bytes = b"{}") -> str:
    """A folder of the two PEFT files, `config` as adapter_config.json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "adapter_config.json").write_bytes(config)
    (root / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    return str(root)


def answering(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> httpx.AsyncClient:
    """A client whose engine server answers every call with one response."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers=headers)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://engine")


def refused_push(http: httpx.AsyncClient, folder: str) -> Exception:
    """What the gateway raises when the engine server behind `http` refuses the push of
    the adapter folder `folder` (as `RemoteEngineClient.load_adapter` pushes it)."""

    async def push() -> None:
        async with http:
            await push_adapter(http, str(http.base_url), AUTH, "bad", folder)

    try:
        asyncio.run(push())
    except Exception as exc:
        return exc
    raise AssertionError("the engine server took the adapter")


@pytest.mark.parametrize("exc", ADAPTER_REFUSED, ids=lambda e: f"{type(e).__name__}-{e.param}")
def test_a_refused_adapter_push_reads_back_as_the_engines_error(
    exc: InvalidRequestError, tmp_path: Path
) -> None:
    response = response_of(refusal_of(exc))  # what engine_server.adapters answers
    assert response.status_code == 400
    read = refused_push(
        answering(400, bytes(response.body), response.raw_headers), adapter_folder(tmp_path)
    )
    assert isinstance(read, InvalidRequestError)
    assert (read.message, read.code, read.param) == (exc.message, exc.code, exc.param)
    assert tenant_answer(read) == tenant_answer(exc)


def test_an_adapter_archive_over_the_servers_cap_is_still_a_bad_request(tmp_path: Path) -> None:
    response = response_of(hop.refusal(hop.TOO_LARGE, "the adapter archive is over 1024 bytes"))
    assert response.status_code == 413
    read = refused_push(
        answering(413, bytes(response.body), response.raw_headers), adapter_folder(tmp_path)
    )
    assert isinstance(read, InvalidRequestError) and type(read) is InvalidRequestError
    assert (read.message, read.param) == ("the adapter archive is over 1024 bytes", None)


# Live: a real engine behind each transport.

# 16 blocks of 16 tokens: a request for 300 tokens can never fit the whole pool, which
# only the engine knows (the gateway checks the 512-token context, not the pool).
ENGINE_OPTIONS: dict[str, Any] = {"num_blocks": 16, "max_model_len": 512}
TOO_LARGE = {"prompt": "hello", "max_tokens": 300}


@dataclass
class Deployment:
    """One engine reached by a gateway in one way."""

    name: str
    gateway: LiveGateway
    engine: AsyncEngine
    server_url: str | None  # the engine server's URL (None: the engine is in-process)


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Deployment]]:
    with contextlib.ExitStack() as stack:
        local = fast_fake_engine(**ENGINE_OPTIONS)
        gw, stop = start_gateway(
            tmp_path_factory.mktemp("in-process"), engine=local, limiter=MemoryLimiter()
        )
        stack.callback(stop)
        found = {"in-process": Deployment("in-process", gw, local, None)}
        served = fast_fake_engine(**ENGINE_OPTIONS)
        server = EngineServer(served, model_name="tiny", auth=ServiceAuth(TOKEN))
        url, stop = serve_in_thread(server.app())
        stack.callback(stop)
        for transport in TRANSPORTS:

            def client(transport: str = transport) -> RemoteEngineClient:
                return RemoteEngineClient(
                    url,
                    token=TOKEN,
                    tokenizer=served.tokenizer,
                    info=fetch_info(url, TOKEN),
                    poll_s=60,
                    transport=transport,  # type: ignore[arg-type]
                )

            gw = stack.enter_context(gateway_over(tmp_path_factory.mktemp(transport), client))
            found[transport] = Deployment(transport, gw, served, url)
        yield found


_TENANTS = itertools.count()


def ask(deployment: Deployment, body: dict[str, Any], tenant: str) -> httpx.Response:
    """`body` sent to the deployment's gateway by a new tenant."""
    key = deployment.gateway.tenant(f"{tenant}-{deployment.name}-{next(_TENANTS)}")
    return httpx.post(
        deployment.gateway.base_url + "/v1/completions",
        json={"model": "tiny", **body},
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )


def answer(response: httpx.Response) -> tuple[Any, ...]:
    """What the tenant was told: the error object, the status and Retry-After. A remote
    engine's refusal of a stream is known before the gateway answers (the stream waits on
    the engine server's admission), so a refused stream is an error response too, never
    a 200 whose first event is the error."""
    assert not response.headers.get("content-type", "").startswith("text/event-stream")
    return response.json()["error"], response.status_code, response.headers.get("retry-after")


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_remote_400_keeps_its_param(
    deployments: dict[str, Deployment], transport: str, stream: bool
) -> None:
    body = {**TOO_LARGE, "stream": stream}
    reference = ask(deployments["in-process"], body, "reference")
    assert reference.status_code == 400
    error = reference.json()["error"]
    assert (error["param"], error["code"]) == ("max_tokens", "request_too_large")
    remote = ask(deployments[transport], body, "remote")
    assert answer(remote) == answer(reference)


@pytest.fixture
def overloaded(
    deployments: dict[str, Deployment], monkeypatch: pytest.MonkeyPatch
) -> dict[str, Deployment]:
    """Both engines refuse every request as overloaded (patched on the real fronts)."""

    def full(request: Any) -> Any:
        raise EngineOverloadedError("the waiting queue is full (4 requests)", retry_after_s=2.0)

    for deployment in deployments.values():
        monkeypatch.setattr(deployment.engine, "submit", full)
    return deployments


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_overload_has_one_type_in_process_and_on_both_transports(
    overloaded: dict[str, Deployment], transport: str, stream: bool
) -> None:
    body = {"prompt": "hello", "max_tokens": 4, "stream": stream}
    reference = ask(overloaded["in-process"], body, "reference")
    assert reference.status_code == 503 and reference.headers["retry-after"] == "2"
    error = reference.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_overloaded")
    remote = ask(overloaded[transport], body, "remote")
    assert answer(remote) == answer(reference)
    # And the engine server's own refusal, as a router or the gateway reads it.
    url = overloaded[transport].server_url
    assert url is not None
    wire = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "stream": stream}
    if transport == "http":
        refusal = httpx.post(url + "/v1/completions", json=wire, headers=AUTH).json()["error"]
    else:
        refusal = asyncio.run(link_refusal(url, wire))
    assert (refusal["type"], refusal["code"]) == (error["type"], error["code"])


async def link_refusal(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """The error frame the engine server's link answers `body` with."""
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(url + "/internal/link", headers=AUTH)
        try:
            await ws.send_bytes(orjson.dumps({"op": "submit", "id": "over-1", "body": body}))
            frame = orjson.loads((await asyncio.wait_for(ws.receive(), 30)).data)
        finally:
            await ws.close()
    assert frame["id"] == "over-1"
    refusal: dict[str, Any] = frame["x"]
    return refusal


def test_the_engine_server_keeps_param_on_both_transports(
    deployments: dict[str, Deployment],
) -> None:
    url = deployments["http"].server_url
    assert url is not None
    wire = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 300}
    http = httpx.post(url + "/v1/completions", json=wire, headers=AUTH)
    assert http.status_code == 400
    frame = asyncio.run(link_refusal(url, {**wire, "stream": True}))
    for error in (http.json()["error"], frame):
        assert (error["param"], error["code"]) == ("max_tokens", "request_too_large")
        assert error["type"] == "invalid_request_error"


def test_a_real_engine_servers_adapter_refusal_keeps_its_code_and_param(
    deployments: dict[str, Deployment], tmp_path: Path
) -> None:
    """A folder the engine cannot read, pushed to the real engine behind an engine server,
    reads as the error the same engine raises for it in-process."""
    folder = adapter_folder(tmp_path / "bad", config=b"not json")
    engine = fast_fake_llm_engine(**ENGINE_OPTIONS)
    try:
        with pytest.raises(InvalidAdapterError) as raised:
            engine.load_adapter("bad", folder)
    finally:
        engine.close()
    reference = raised.value
    assert (reference.code, reference.param) == ("invalid_adapter", "path")
    url = deployments["http"].server_url
    assert url is not None
    read = refused_push(httpx.AsyncClient(base_url=url), folder)
    assert isinstance(read, InvalidAdapterError)
    assert (read.message, read.code, read.param) == (
        reference.message,
        reference.code,
        reference.param,
    )
    assert tenant_answer(read) == tenant_answer(reference)
