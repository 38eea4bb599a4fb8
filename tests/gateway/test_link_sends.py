"""The link's sends: written in the caller while the socket takes them, queued in order
behind one that has to wait (engine_hop.eager, engine_server.link, and the
gateway's side, engine_hop.link_client)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from engine.fronts.async_engine import RequestStream
from engine.outputs import StreamEvent
from engine_hop.eager import start_now
from engine_hop.link_client import EngineLink, LinkStream
from engine_hop.remote_errors import EngineUnavailableError
from engine_server.link import _Connection


def test_start_now_runs_a_coroutine_that_never_waits_in_the_caller() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    async def scenario() -> None:
        assert start_now(quick()) is None
        assert done == ["ran"]  # before any await of the caller's

    asyncio.run(scenario())


def test_start_now_finishes_a_coroutine_that_waits_on_the_loop() -> None:
    steps: list[str] = []

    async def waits(gate: asyncio.Event) -> None:
        steps.append("before")
        await gate.wait()
        await asyncio.sleep(0)  # a bare yield too
        steps.append("after")

    async def scenario() -> None:
        gate = asyncio.Event()
        rest = start_now(waits(gate))
        assert rest is not None and steps == ["before"]
        gate.set()
        await asyncio.wait_for(rest, 5)
        assert steps == ["before", "after"]

    asyncio.run(scenario())


def test_start_now_raises_in_the_caller_or_through_its_future() -> None:
    async def fails_at_once() -> None:
        raise ValueError("at once")

    async def fails_later(gate: asyncio.Event) -> None:
        await gate.wait()
        raise KeyError("later")

    async def scenario() -> None:
        with pytest.raises(ValueError, match="at once"):
            start_now(fails_at_once())
        gate = asyncio.Event()
        rest = start_now(fails_later(gate))
        assert rest is not None
        gate.set()
        with pytest.raises(KeyError, match="later"):
            await rest

    asyncio.run(scenario())


def test_cancelling_the_rest_closes_the_coroutine() -> None:
    cleaned: list[bool] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append(True)

    async def scenario() -> None:
        rest = start_now(waits_forever())
        assert rest is not None
        rest.cancel()
        with pytest.raises(asyncio.CancelledError):
            await rest

    asyncio.run(scenario())
    assert cleaned == [True]


class GatedSocket:
    """A WebSocket whose sends wait while its gate is shut (a paused transport)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.broken = False
        self.closed = False  # as aiohttp's client WebSocket has it

    async def send_bytes(self, data: bytes) -> None:
        await self.gate.wait()
        if self.broken:
            raise RuntimeError("the socket is closed")
        self.sent.append(orjson.loads(data)["n"])


def linked(socket: GatedSocket, failures: list[str]) -> EngineLink:
    """A gateway's link whose WebSocket is `socket`, as if connected."""
    link = EngineLink(
        "http://engine.invalid",
        headers={},
        session=lambda: pytest.fail("no connection is opened"),
        on_failure=lambda: failures.append("failed"),
        on_draining=lambda: None,
    )
    link._ws = socket  # type: ignore[assignment]
    return link


def sender(side: str, socket: GatedSocket, failures: list[str]) -> Callable[[Any], None]:
    """The engine server's or the gateway's way to send a frame on `socket`."""
    if side == "engine":
        return _Connection(None, socket).post  # type: ignore[arg-type]
    return linked(socket, failures).send


@pytest.mark.parametrize("side", ["engine", "gateway"])
def test_frames_go_out_at_once_and_in_order_behind_a_send_that_waits(side: str) -> None:
    async def scenario() -> list[Any]:
        socket, failures = GatedSocket(), []
        send = sender(side, socket, failures)
        send({"n": 1})
        assert socket.sent == [1]  # written in the caller: no task, no loop iteration
        socket.gate.clear()
        for n in (2, 3, 4):
            send({"n": n})
        await asyncio.sleep(0.01)
        assert socket.sent == [1]  # the socket is backed up: nothing overtakes
        socket.gate.set()
        for _ in range(100):
            await asyncio.sleep(0)
        assert socket.sent == [1, 2, 3, 4]
        send({"n": 5})
        assert socket.sent == [1, 2, 3, 4, 5]  # at once again
        assert failures == []
        return socket.sent

    assert asyncio.run(scenario()) == [1, 2, 3, 4, 5]


def test_a_socket_that_breaks_while_backed_up_takes_no_more_frames() -> None:
    async def scenario() -> list[Any]:
        socket = GatedSocket()
        connection = _Connection(None, socket)  # type: ignore[arg-type]
        socket.gate.clear()
        connection.post({"n": 1})
        connection.post({"n": 2})
        socket.broken = True
        socket.gate.set()
        for _ in range(100):
            await asyncio.sleep(0)
        socket.broken = False
        connection.post({"n": 3})  # dropped: the reader notices the closed link
        return socket.sent

    assert asyncio.run(scenario()) == []


def test_a_listened_stream_hands_over_what_was_queued_then_each_item_as_pushed() -> None:
    def event(n: int, finished: bool = False) -> StreamEvent:
        return StreamEvent("r", (), (), n, finished)

    async def scenario() -> tuple[list[Any], bool]:
        stream = RequestStream("r")
        stream.put(event(1))
        got: list[Any] = []
        stream.listen(got.append)
        assert [e.num_cached_tokens for e in got] == [1]
        stream.put(event(2))
        failure = RuntimeError("engine failed")
        stream.put(failure)
        return got, stream._queue.empty()

    got, empty = asyncio.run(scenario())
    assert [e.num_cached_tokens for e in got[:2]] == [1, 2] and isinstance(got[2], RuntimeError)
    assert empty  # nothing left for an iterator


def test_an_inline_send_that_fails_later_ends_the_streams_with_a_clean_error() -> None:
    async def scenario() -> None:
        socket, failures = GatedSocket(), []
        link = linked(socket, failures)
        stream = LinkStream(link, "r", ())
        link._streams["r"] = stream
        socket.gate.clear()
        link.send({"n": 1})  # waits on the paused transport
        socket.broken = True
        socket.gate.set()
        error = await asyncio.wait_for(stream._queue.get(), 5)
        assert isinstance(error, EngineUnavailableError) and "broke" in str(error)
        assert failures == ["failed"]  # one failed poll of the replica
        assert socket.sent == []

    asyncio.run(scenario())


class RecordingSocket:
    """A WebSocket that takes every frame at once and keeps what each one held."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(orjson.loads(data))


def test_batched_events_leave_in_one_frame_and_nothing_overtakes_them() -> None:
    async def scenario() -> list[Any]:
        socket = RecordingSocket()
        connection = _Connection(None, socket)  # type: ignore[arg-type]
        connection.post_event({"id": "a", "e": 1})
        connection.post_event({"id": "b", "e": 1})
        assert socket.sent == []  # held until the report has been routed
        connection.flush()
        connection.post_event({"id": "a", "e": 2})
        connection.post({"id": "b", "f": "failed"})  # sent now, behind the batched event
        connection.post_event({"id": "a", "e": 3})  # handed over outside a report
        await asyncio.sleep(0)  # sent on the loop's next turn
        connection.flush()  # nothing left: no empty frame
        return socket.sent

    assert asyncio.run(scenario()) == [
        [{"id": "a", "e": 1}, {"id": "b", "e": 1}],
        [{"id": "a", "e": 2}, {"id": "b", "f": "failed"}],
        {"id": "a", "e": 3},
    ]
