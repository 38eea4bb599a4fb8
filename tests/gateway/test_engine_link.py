"""The link: the gateway's requests to an engine server over one WebSocket.

In one process (fast): an engine server app over the scripted front (the real one over
the fake fast model, tests/gateway/test_engine_hop_wire.py), served by uvicorn in a
thread, reached by `RemoteEngineClient` on its default transport (the link) and, for
hostile frames, by a raw aiohttp WebSocket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from engine.errors import EngineDeadError, InvalidRequestError
from engine.outputs import StreamEvent
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_hop.remote_errors import EngineUnavailableError
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tests.gateway.engine_servers import serve_in_thread, start_in_thread
from tests.gateway.test_engine_hop_wire import TOKEN, ScriptedEngine, collect, request
from tests.utils.byte_tokenizer import ByteTokenizer

AUTH = {"authorization": f"Bearer {TOKEN}"}
LINK = "/internal/link"


class Served:
    """An engine server in a thread, its app object and its engine."""

    def __init__(self) -> None:
        self.engine = ScriptedEngine()
        self.server = EngineServer(self.engine, model_name="tiny", auth=ServiceAuth(TOKEN))
        started = start_in_thread(self.server.app())
        self.url, self.stop, self.loop = started.url, started.stop, started.loop


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    s = Served()
    try:
        yield s
    finally:
        s.stop()


def client_of(
    url: str, transport: str = "link", token: str = TOKEN, **options: Any
) -> RemoteEngineClient:
    """A client of the engine server at `url` that polls rarely (`options`: the rest)."""
    return RemoteEngineClient(
        url,
        token=token,
        tokenizer=ByteTokenizer(),
        info=fetch_info(url, TOKEN),
        poll_s=60,
        transport=transport,  # type: ignore[arg-type]
        **options,
    )


def comparable(events: list[StreamEvent]) -> list[tuple[Any, ...]]:
    """Everything but the wall-clock metrics."""
    return [(e.deltas, e.prompt_token_ids, e.num_cached_tokens, e.finished) for e in events]


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_link_and_http_carry_the_same_events(served: Served) -> None:
    async def both() -> tuple[list[StreamEvent], list[StreamEvent]]:
        link, http = client_of(served.url), client_of(served.url, "http")
        try:
            return (
                await collect(link, request((10, 11, 12), 6, "same-link")),
                await collect(http, request((10, 11, 12), 6, "same-http")),
            )
        finally:
            await link.shutdown()
            await http.shutdown()

    over_link, over_http = asyncio.run(both())
    assert len(over_link) == 6 and over_link[-1].finished
    assert comparable(over_link) == comparable(over_http)
    assert all(e.request_id == "same-link" for e in over_link)


def test_concurrent_requests_share_one_websocket(served: Served) -> None:
    async def many() -> tuple[list[list[StreamEvent]], int]:
        client = client_of(served.url)
        try:
            results = await asyncio.gather(
                *(
                    collect(client, request((40, i), 5, f"many-{i}")) for i in range(4)
                )  # the fake queues 4
            )
            return list(results), served.server.link.connections()
        finally:
            await client.shutdown()

    results, connections = asyncio.run(many())
    assert connections == 1
    for i, events in enumerate(results):
        assert events[-1].finished and sum(len(d.token_ids) for e in events for d in e.deltas) == 5
        assert {e.request_id for e in events} == {f"many-{i}"}  # no frame went astray


def test_the_link_refuses_a_handshake_without_the_service_credential(served: Served) -> None:
    async def handshakes() -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"authorization": "Bearer sk-tenant-key-is-not-a-service-token"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await session.ws_connect(served.url + LINK, headers=headers)
                statuses.append(refused.value.status)
        client = client_of(served.url, token="svc-" + "the-wrong-token-entirely-xx")
        try:
            with pytest.raises(EngineUnavailableError, match="service credential"):
                await collect(client, request((1, 2), 2, "wrong-token"))
        finally:
            await client.shutdown()
        return statuses

    assert asyncio.run(handshakes()) == [401, 401]
    assert "wrong-token" not in served.engine.submitted


async def frames_until(ws: aiohttp.ClientWebSocketResponse, request_id: str) -> list[Any]:
    """The messages for `request_id` up to its last (finished, refused or failed), each
    on its own: a frame of one engine step's events (an array) is read message by
    message."""
    got = []
    while True:
        message = await asyncio.wait_for(ws.receive(), 10)
        assert message.type == aiohttp.WSMsgType.BINARY, message
        frame = orjson.loads(message.data)
        for one in frame if isinstance(frame, list) else [frame]:
            if one.get("id") != request_id:
                continue
            got.append(one)
            if "x" in one or "f" in one or one["e"]["f"]:
                return got


def test_hostile_frames_are_refused_and_the_link_keeps_serving(served: Served) -> None:
    good_body = {"model": "tiny", "prompt": [50, 51], "max_tokens": 3, "stream": True}

    async def hostile() -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(served.url + LINK, headers=AUTH) as ws,
        ):
            malformed: list[bytes | str] = [
                b"\xff not json",
                b"[1, 2]",
                orjson.dumps({"op": "submit", "body": good_body}),  # no id
                orjson.dumps({"op": "explode", "id": "x-1"}),
                orjson.dumps({"op": "submit", "id": "x-2", "body": "prompt"}),
                orjson.dumps({"op": "submit", "id": "x-3", "body": good_body, "headers": [1]}),
                orjson.dumps({"op": "submit", "id": "x" * 300, "body": good_body}),
                "text frames are read too, and refused the same",
            ]
            refusals = []
            for frame in malformed:
                if isinstance(frame, str):
                    await ws.send_str(frame)
                else:
                    await ws.send_bytes(frame)
                reply = orjson.loads((await asyncio.wait_for(ws.receive(), 10)).data)
                refusals.append(reply)
            # Checked as an HTTP body is: another model, a bad field, a bad prompt.
            checked = []
            for rid, body in (
                ("other-model", {**good_body, "model": "gpt-4"}),
                ("bad-temp", {**good_body, "temperature": "hot"}),
                ("bad-prompt", {**good_body, "prompt": [1, "two"]}),
                ("too-long", {**good_body, "prompt": [1] * 600}),
            ):
                await ws.send_bytes(orjson.dumps({"op": "submit", "id": rid, "body": body}))
                checked.append((await frames_until(ws, rid))[-1])
            # A second request under an id in flight is refused; the first goes on.
            long_body = {**good_body, "max_tokens": 40}
            await ws.send_bytes(orjson.dumps({"op": "submit", "id": "twice", "body": long_body}))
            await ws.send_bytes(orjson.dumps({"op": "submit", "id": "twice", "body": good_body}))
            twice = await frames_until(ws, "twice")
            await ws.send_bytes(orjson.dumps({"op": "submit", "id": "after", "body": good_body}))
            after = await frames_until(ws, "after")
            return refusals, checked, twice, after

    refusals, checked, twice, after = asyncio.run(hostile())
    for reply in refusals:
        assert reply["id"] is None and reply["x"]["status"] == 400
        assert reply["x"]["code"] == "invalid_link_frame" and reply["x"]["message"]
    assert [c["x"]["status"] for c in checked] == [404, 400, 400, 400]
    assert checked[3]["x"]["code"] == "context_length_exceeded"
    assert twice[-1]["x"]["message"] == "a request with this id is in flight"
    assert all(not f["e"]["f"] for f in twice[:-1])  # the first one's events, unfinished
    assert [f["e"]["f"] for f in after] == [False, False, True]  # still serving
    deadline = time.monotonic() + 5
    while "twice" in served.engine.running:  # the link closed: its requests aborted
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_an_abort_frame_and_a_closed_link_each_stop_requests(served: Served) -> None:
    engine = served.engine

    async def stop_them() -> None:
        client = client_of(served.url)
        try:
            stream = client.submit(request((60, 1), 400, "aborted-1"))
            assert not (await stream.__anext__()).finished
            await client.abort("aborted-1")
            await until(lambda: "aborted-1" in engine.abort_calls)
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(served.url + LINK, headers=AUTH)
                body = {"model": "tiny", "prompt": [61], "max_tokens": 400, "stream": True}
                await ws.send_bytes(orjson.dumps({"op": "submit", "id": "dropped-1", "body": body}))
                await ws.receive()  # the first event: it runs
                await ws.close()
            await until(lambda: "dropped-1" in engine.abort_calls)
        finally:
            await client.shutdown()

    asyncio.run(stop_them())
    assert engine.abort_calls.count("aborted-1") == 1
    assert not {"aborted-1", "dropped-1"} & engine.running  # 400 tokens would take 4 s
    assert served.server.link.in_flight() == 0


def test_a_drain_finishes_the_links_streams_and_admits_nothing_new() -> None:
    s = Served()

    async def drain() -> tuple[list[StreamEvent], bool, bool]:
        client = client_of(s.url)
        try:
            stream = client.submit(request((70, 1), 30, "draining-1"))
            first = await stream.__anext__()
            assert client.alive and s.server.link.in_flight() == 1
            # On the server's loop, as `cloister engine serve` drains: its link's sockets
            # live there (started from this loop, the "draining" frame could wait unsent).
            drained = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(s.server.drain(10.0), s.loop)
            )
            events = [first] + [e async for e in stream]
            await until(lambda: not client.alive)  # told over the link, not by a poll
            await drained
            idle = await s.server.link.wait_idle(0.1)
            with pytest.raises(EngineUnavailableError, match="503"):
                await collect(client, request((71,), 2, "refused-1"))
            return events, idle, client.alive
        finally:
            await client.shutdown()

    try:
        events, idle, alive = asyncio.run(drain())
    finally:
        s.stop()
    assert events[-1].finished and sum(len(d.token_ids) for e in events for d in e.deltas) == 30
    assert idle and not alive
    assert "refused-1" not in s.engine.submitted


def test_an_engine_gone_mid_stream_ends_the_stream_with_a_clean_error() -> None:
    s = Served()

    async def gone() -> int:
        client = client_of(s.url)
        try:
            stream = client.submit(request((80, 1), 400, "orphan-1"))
            await stream.__anext__()
            await asyncio.get_running_loop().run_in_executor(None, s.stop)
            with pytest.raises(EngineUnavailableError):
                async for _ in stream:
                    pass
            with pytest.raises(EngineDeadError, match="engine server"):  # reconnects, fails
                await collect(client, request((81,), 2, "nowhere-1"))
            return client._failures
        finally:
            await client.shutdown()

    failures = asyncio.run(gone())
    assert failures >= 2  # each counts as a failed poll: the replica set routes elsewhere


def test_an_invalid_request_over_the_link_is_the_tenants_error(served: Served) -> None:
    async def bad() -> InvalidRequestError:
        client = client_of(served.url)
        try:
            with pytest.raises(InvalidRequestError) as refused:
                await collect(client, request((1,) * 600, 4, "long-1"))
            ok = await collect(client, request((90,), 2, "ok-after"))  # the link stays up
            assert ok[-1].finished
            return refused.value
        finally:
            await client.shutdown()

    assert asyncio.run(bad()).code == "context_length_exceeded"


def test_the_transport_and_read_timeout_are_settings_and_bad_ones_are_refused_by_name(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import click

    from assembly.remote_engines import remote_engine_clients
    from cloister.commands.serve import load_settings
    from server.settings import Settings

    def clients(**extra: Any) -> dict[str, Any]:
        extra.setdefault("engine_urls", (served.url,))
        settings = Settings(data_dir=tmp_path, model_name="tiny", service_token=TOKEN, **extra)
        made = remote_engine_clients(settings)
        for client in made.values():
            asyncio.run(client.shutdown())
        return made

    assert clients()["tiny"].transport == "link"
    assert clients(engine_transport="http")["tiny"].transport == "http"
    assert clients()["tiny"]._link._read_timeout_s == 600.0
    assert clients(engine_read_timeout_s=2.5)["tiny"]._link._read_timeout_s == 2.5
    replicas = clients(engine_urls=("dns+" + served.url,), engine_read_timeout_s=3.5)["tiny"]
    assert [r.client._link._read_timeout_s for r in replicas._replicas.values()] == [3.5]
    monkeypatch.setenv("CLOISTER_ENGINE_TRANSPORT", "carrier-pigeon")
    with pytest.raises(click.ClickException, match="engine_transport"):
        load_settings()
    monkeypatch.delenv("CLOISTER_ENGINE_TRANSPORT")
    for bad in ("0", "-1", "nan", "inf", "soon", "1e9"):
        monkeypatch.setenv("CLOISTER_ENGINE_READ_TIMEOUT_S", bad)
        with pytest.raises(click.ClickException, match="engine_read_timeout_s"):
            load_settings()


@pytest.mark.parametrize(
    "reply",
    [
        b"not json",
        b'{"id": "bad-1"}',
        b'{"id": "bad-1", "e": {"d": 7}}',
        b'{"op": 3}',
        b'[{"id": "bad-1"}]',
        b"[7]",
    ],
    ids=["not-json", "no-kind", "bad-event", "no-id", "batch-no-kind", "batch-of-a-number"],
)
def test_a_malformed_frame_from_an_engine_ends_the_stream_cleanly(reply: bytes) -> None:
    """An engine that sends what the link does not say (a bug, or a version skew) ends
    the streams on that link with an unavailable engine, at once, not a hang."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from engine_hop.remote_client import EngineServerInfo

    async def babbler(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.receive_bytes()  # the submit
        await websocket.send_bytes(reply)
        await websocket.receive()  # until the gateway hangs up

    url, stop = serve_in_thread(Starlette(routes=[WebSocketRoute(LINK, babbler)]))
    info = EngineServerInfo("tiny", 512, 260, 64, 16)

    async def talk() -> None:
        client = RemoteEngineClient(
            url, token=TOKEN, tokenizer=ByteTokenizer(), info=info, poll_s=60
        )
        try:
            with pytest.raises(EngineUnavailableError):
                await asyncio.wait_for(collect(client, request((1, 2), 4, "bad-1")), 10)
        finally:
            await client.shutdown()

    try:
        asyncio.run(talk())
    finally:
        stop()


def test_a_request_its_engine_never_answers_times_out_is_aborted_and_others_flow() -> None:
    """A stuck engine behind a live socket (its pongs still come): the request that
    hears nothing for the read timeout fails as the engine's, an abort frame goes out,
    and the replica counts a failed poll. A slower request whose events keep coming,
    over longer than the timeout in all, is not cut."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    from engine_hop.remote_client import EngineServerInfo

    seen: list[dict[str, Any]] = []

    def event(request_id: str, last: bool) -> bytes:
        delta = [0, "a", [97], None, "length" if last else None]
        return orjson.dumps({"id": request_id, "e": {"d": [delta], "c": 0, "f": last, "m": None}})

    async def stuck_engine(websocket: WebSocket) -> None:
        await websocket.accept()

        async def trickle(request_id: str) -> None:
            for i in range(8):  # 8 x 0.15 s: twice the timeout, never idle for it
                await asyncio.sleep(0.15)
                await websocket.send_bytes(event(request_id, last=i == 7))

        tasks = []
        while True:
            message = await websocket.receive()
            if message.get("bytes") is None:
                break
            frame = orjson.loads(message["bytes"])
            seen.append(frame)
            if frame["id"].startswith("trickle"):
                tasks.append(asyncio.get_running_loop().create_task(trickle(frame["id"])))
            # anything else: never a word

    url, stop = serve_in_thread(Starlette(routes=[WebSocketRoute(LINK, stuck_engine)]))
    info = EngineServerInfo("tiny", 512, 260, 64, 16)

    async def talk() -> tuple[list[StreamEvent], BaseException, float, int]:
        client = RemoteEngineClient(
            url, token=TOKEN, tokenizer=ByteTokenizer(), info=info, poll_s=60,
            request_timeout_s=0.6,
        )  # fmt: skip

        async def mute() -> tuple[BaseException, float]:
            started = time.monotonic()
            with pytest.raises(EngineUnavailableError) as failed:
                await collect(client, request((1, 2), 4, "mute-1"))
            return failed.value, time.monotonic() - started

        try:
            (mute_error, elapsed), trickled = await asyncio.wait_for(
                asyncio.gather(mute(), collect(client, request((3, 4), 8, "trickle-1"))), 10
            )
            await until(lambda: {"op": "abort", "id": "mute-1"} in seen)
            return trickled, mute_error, elapsed, client._failures
        finally:
            await client.shutdown()

    try:
        trickled, mute_error, elapsed, failures = asyncio.run(talk())
    finally:
        stop()
    assert "sent nothing for request mute-1 in 0.6 s" in str(mute_error)
    assert 0.6 <= elapsed < 5.0
    assert len(trickled) == 8 and trickled[-1].finished  # 1.2 s in all, never cut
    assert failures == 1
    assert not any(f.get("op") == "abort" and f["id"] == "trickle-1" for f in seen)
