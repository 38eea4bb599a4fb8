"""A remote engine's admission is known before the gateway answers (issue 42 item 3 for
split deployments, issue 43's streamed refusal after the 200).

An engine server admits or refuses a request after the gateway's `submit` returned; the
remote stream's `admitted` waits for that word (over HTTP the 200's status line, sent at
admission; over the link the accepted frame) and raises the refusal as the engine's own
error. So an overloaded remote model falls back to its registry fallback as an
in-process one does, and a refused streamed request gets its error status, not a 200
whose first event is the error.

Live: a real engine (the fast fake model) behind an in-thread engine server with one
running slot and one waiting slot. Another fairness key's two long requests take both
(`engine_full`), so the engine refuses every other key as overloaded, by its own queue
check; nothing is patched.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
from fastapi.testclient import TestClient

from engine.errors import EngineOverloadedError
from engine.fronts.async_engine import AsyncEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop.in_process import InProcessEngineClient
from engine_hop.remote_client import RemoteEngineClient, Transport, fetch_info
from engine_hop.replica_set import ReplicaSetClient
from engine_hop.wire import (
    ACCEPTED_FEATURE,
    EVENTS_WIRE,
    FAIRNESS_HEADER,
    LINK_FEATURES_HEADER,
    LINK_PATH,
    REQUEST_ID_HEADER,
    WIRE_HEADER,
)
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tenancy import store
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.fallback_gateway import (
    SMALL_PRICE,
    MeteredGateway,
    fallback_count,
    register_big_falling_back_to_small,
    sqlite_sessions,
)
from tests.utils.fast_fake_model import fast_fake_engine

TOKEN = "svc-" + "remote-fallback-token-for-tests-only"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TRANSPORTS: tuple[Transport, ...] = ("http", "link")
# One sequence runs, one waits: a third from another key is over the queue.
ENGINE_OPTIONS: dict[str, Any] = {
    "max_num_seqs": 1,
    "max_waiting": 1,
    "num_blocks": 64,
    "max_model_len": 512,
}
OCCUPIER = "occupier"  # the fairness key whose requests fill the engine


@pytest.fixture(scope="module")
def idle_server() -> Iterator[str]:
    """The URL of another engine server serving "big", with the default queue."""
    server = EngineServer(
        fast_fake_engine(max_model_len=512), model_name="big", auth=ServiceAuth(TOKEN)
    )
    url, stop = serve_in_thread(server.app())
    try:
        yield url
    finally:
        stop()


@pytest.fixture(scope="module")
def big_server() -> Iterator[str]:
    """The URL of an engine server serving "big" on the small engine (each step slowed, so
    that a long request holds its slot for the whole test)."""
    engine = fast_fake_engine(compute_s=0.02, **ENGINE_OPTIONS)
    server = EngineServer(engine, model_name="big", auth=ServiceAuth(TOKEN))
    url, stop = serve_in_thread(server.app())
    try:
        yield url
    finally:
        stop()


def _stats(http: httpx.Client) -> dict[str, Any]:
    stats: dict[str, Any] = http.get("/internal/stats").json()
    return stats


def _holds(http: httpx.Client, state: str) -> bool:
    """Whether the engine has a sequence in `state` (num_running or num_waiting)."""
    return int(_stats(http)[state]) >= 1


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@contextlib.contextmanager
def engine_full(url: str, slots: int = 2) -> Iterator[None]:
    """The engine's running slot (and, with `slots` 2, its waiting slot) taken by the
    `OCCUPIER` key's long streamed requests, until the block ends and they hang up."""
    body = {"model": "big", "prompt": [1, 2, 3], "max_tokens": 400, "ignore_eos": True}
    headers = {**AUTH, WIRE_HEADER: EVENTS_WIRE, FAIRNESS_HEADER: OCCUPIER}
    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as http:
        with contextlib.ExitStack() as held:
            for i, state in enumerate(("num_running", "num_waiting")[:slots]):
                ids = {REQUEST_ID_HEADER: f"occupier-{time.monotonic_ns()}-{i}"}
                response = held.enter_context(
                    http.stream(
                        "POST",
                        "/v1/completions",
                        json={**body, "stream": True},
                        headers={**headers, **ids},
                    )
                )
                assert response.status_code == 200
                _wait_for(functools.partial(_holds, http, state), state)
            yield
        # Hung up: the engine aborts them; the next test starts from an idle engine.
        _wait_for(lambda: _stats(http)["num_running"] + _stats(http)["num_waiting"] == 0, "idle")


class Gateway(MeteredGateway):
    """A gateway serving "big" from the engine server over `transport` (falls back to
    "small") and "small" in-process, over the real registry reader and metering."""

    def __init__(self, tmp_path: Path, url: str, transport: Transport) -> None:
        self.sessions = sqlite_sessions(tmp_path)
        with self.sessions() as s:
            self.acme = store.create_tenant(s, name="acme").id
            store.create_tenant(s, name="other")
            register_big_falling_back_to_small(s, ("big", "small"), self.acme)
        self.small: AsyncEngine = fast_fake_engine(max_model_len=512)
        big = RemoteEngineClient(
            url,
            token=TOKEN,
            tokenizer=self.small.tokenizer,  # the same tokenizer as the served engine's
            info=fetch_info(url, TOKEN),
            poll_s=60,
            transport=transport,
        )
        self.serve(
            tmp_path, {"big": big, "small": InProcessEngineClient(self.small, model_name="small")}
        )


@pytest.fixture(scope="module", params=TRANSPORTS)
def gateway(
    request: pytest.FixtureRequest, big_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, TestClient]]:
    transport: Transport = request.param
    gw = Gateway(tmp_path_factory.mktemp(transport), big_server, transport)
    try:
        with TestClient(gw.app) as client:
            yield gw, client
    finally:
        gw.close()


def _post(client: TestClient, body: dict[str, Any], key: str) -> httpx.Response:
    return client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def _events(response: httpx.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]


BODY = {"model": "big", "prompt": "hello there", "max_tokens": 8, "temperature": 0}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_an_overloaded_remote_model_answers_from_its_fallback(
    gateway: tuple[Gateway, TestClient], big_server: str, stream: bool
) -> None:
    gw, client = gateway
    before_rows, before_count = len(gw.usage()), fallback_count(client)
    body: dict[str, Any] = {**BODY, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    with engine_full(big_server):
        r = _post(client, body, gw.new_key("acme"))
    assert r.status_code == 200, r.text
    if stream:
        events = _events(r)
        assert {e["model"] for e in events} == {"small"}
        assert not any("error" in e for e in events)
        usage = events[-1]["usage"]
    else:
        assert r.json()["model"] == "small"
        usage = r.json()["usage"]
    rows = gw.usage()[before_rows:]
    assert [(row.model, row.status) for row in rows] == [("small", 200)]
    (row,) = rows
    assert (row.prompt_tokens, row.completion_tokens) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert row.completion_tokens > 0
    # Metered at the fallback's price, not the model the client asked for.
    assert row.cost_pico_usd == SMALL_PRICE.cost_pico_usd(
        prompt_tokens=row.prompt_tokens, cached_tokens=0, completion_tokens=row.completion_tokens
    )
    assert fallback_count(client) == before_count + 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_remote_overload_without_a_usable_fallback_is_a_503_status(
    gateway: tuple[Gateway, TestClient], big_server: str, stream: bool
) -> None:
    gw, client = gateway
    before_rows, before_count = len(gw.usage()), fallback_count(client)
    with engine_full(big_server):
        # "other" may not use the fallback.
        r = _post(client, {**BODY, "stream": stream}, gw.new_key("other"))
    assert r.status_code == 503, r.text
    assert not r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["retry-after"].isdigit()
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "server_error",
        "engine_overloaded",
        None,
    )
    rows = gw.usage()[before_rows:]
    assert [(row.model, row.status, row.prompt_tokens) for row in rows] == [("big", 503, 0)]
    assert fallback_count(client) == before_count


def test_a_remote_model_not_overloaded_answers_itself(
    gateway: tuple[Gateway, TestClient],
) -> None:
    gw, client = gateway
    r = _post(client, {**BODY, "stream": True}, gw.new_key("acme"))
    assert r.status_code == 200, r.text
    assert {e["model"] for e in _events(r)} == {"big"}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_queued_request_is_admitted_before_its_first_token(
    big_server: str, transport: Transport
) -> None:
    """A request that waits behind a running one has no token for as long as that runs,
    yet its admission is known at once; the next one over the queue is refused."""

    async def run() -> tuple[bool, BaseException | None]:
        client = RemoteEngineClient(
            big_server,
            token=TOKEN,
            tokenizer=fast_fake_engine(max_model_len=512).tokenizer,
            info=fetch_info(big_server, TOKEN),
            poll_s=60,
            transport=transport,
        )
        params = SamplingParams(max_tokens=4)
        try:
            queued = client.submit(
                EngineRequest(prompt_token_ids=(5, 6, 7), params=params, fairness_key="t")
            )
            await asyncio.wait_for(queued.admitted(), 10)
            try:  # the running request holds the engine for seconds yet
                await asyncio.wait_for(queued.__anext__(), 0.5)
                no_token_yet = False
            except TimeoutError:
                no_token_yet = True
            over = client.submit(
                EngineRequest(prompt_token_ids=(5, 6, 8), params=params, fairness_key="t")
            )
            refused: BaseException | None = None
            try:
                await asyncio.wait_for(over.admitted(), 10)
            except EngineOverloadedError as exc:
                refused = exc
            await queued.aclose()
            await over.aclose()
            return no_token_yet, refused
        finally:
            await client.shutdown()

    with engine_full(big_server, slots=1):
        no_token_yet, refused = asyncio.run(run())
    assert no_token_yet
    assert isinstance(refused, EngineOverloadedError)
    assert refused.retry_after_s >= 1


def _request(prompt: tuple[int, ...]) -> EngineRequest:
    return EngineRequest(prompt_token_ids=prompt, params=SamplingParams(max_tokens=4))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_replica_set_passes_an_overloaded_replicas_request_on_at_admission(
    big_server: str, idle_server: str, transport: Transport
) -> None:
    """Round robin sends every other request to the full replica first: each is admitted
    by the idle one. A set whose every replica is full raises the overload itself."""

    def replica_set(urls: list[str]) -> ReplicaSetClient:
        return ReplicaSetClient(
            urls,
            token=TOKEN,
            tokenizer=fast_fake_engine(max_model_len=512).tokenizer,
            model_name="big",
            policy="round_robin",
            poll_s=60,
            transport=transport,
        )

    async def run() -> tuple[dict[str, int], BaseException | None]:
        both, full_only = replica_set([big_server, idle_server]), replica_set([big_server])
        try:
            streams = [both.submit(_request((9, 9, i))) for i in range(4)]
            for stream in streams:
                await asyncio.wait_for(stream.admitted(), 10)
            placed = dict(both.in_flight())
            for stream in streams:
                await stream.aclose()
            refused: BaseException | None = None
            try:
                await asyncio.wait_for(full_only.submit(_request((9, 9, 9))).admitted(), 10)
            except EngineOverloadedError as exc:
                refused = exc
            return placed, refused
        finally:
            await both.shutdown()
            await full_only.shutdown()

    with engine_full(big_server):
        placed, refused = asyncio.run(run())
    assert placed == {idle_server: 4}
    assert isinstance(refused, EngineOverloadedError)


@pytest.mark.parametrize("asks", [True, False], ids=["asks", "older-gateway"])
def test_the_link_sends_the_accepted_frame_only_to_a_gateway_that_asks(
    idle_server: str, asks: bool
) -> None:
    """The accepted frame comes first, before the request's events; a gateway that does
    not ask on the handshake (an older one) gets the events alone, as before."""

    async def frames() -> list[dict[str, Any]]:
        headers = {**AUTH, **({LINK_FEATURES_HEADER: ACCEPTED_FEATURE} if asks else {})}
        body = {"model": "big", "prompt": [1, 2, 3], "max_tokens": 2, "stream": True}
        got: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(idle_server + LINK_PATH, headers=headers)
            try:
                await ws.send_bytes(orjson.dumps({"op": "submit", "id": "r1", "body": body}))
                while not any(f.get("e", {}).get("f") for f in got):
                    frame = orjson.loads((await asyncio.wait_for(ws.receive(), 30)).data)
                    got.extend(frame if isinstance(frame, list) else [frame])
            finally:
                await ws.close()
        return got

    got = asyncio.run(frames())
    assert all(f["id"] == "r1" for f in got)
    kinds = [sorted(set(f) - {"id"}) for f in got]
    if asks:
        assert got[0] == {"id": "r1", "a": 1}
        assert kinds[1:] and all(k == ["e"] for k in kinds[1:])
    else:
        assert kinds and all(k == ["e"] for k in kinds)
