"""Replay of KV-cache event batches, as vLLM's publisher serves it: a subscriber that
joined late or saw a gap asks a ROUTER for the batches from a sequence number on, and
gets each kept one, then an end marker (sequence number -1, empty payload)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from engine.kv_cache.kv_events import AllBlocksCleared, KVEventBatch, decode_batch
from engine.kv_events_endpoint import KVEventsEndpointError
from engine.kv_events_publisher import KVEventPublisher
from tests.utils.kv_replay import replay
from tests.utils.services import free_port

Replayed = list[tuple[int, float]]  # (sequence number, the batch's ts)


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[KVEventPublisher]:
    """A publisher with no subscriber, keeping its last 4 batches for replay."""
    p = KVEventPublisher(
        f"tcp://127.0.0.1:{free_port()}",
        "kv@pod@m",
        replay_endpoint=f"ipc://{tmp_path}/replay",
        buffer_steps=4,
    )
    yield p
    p.close()


def _publish(publisher: KVEventPublisher, *stamps: float) -> None:
    for ts in stamps:
        publisher.publish(KVEventBatch(ts=ts, events=[AllBlocksCleared()]))


def _replay(endpoint: str, start: bytes, *, envelope: bool = True) -> Replayed:
    return [(seq, decode_batch(p).ts) for seq, p in replay(endpoint, start, envelope=envelope)]


def _replay_when(endpoint: str, start: int, expected: Replayed) -> Replayed:
    """Replays until the publisher's thread has kept what was published (it sends on a
    thread of its own), or 10 s."""
    deadline = time.monotonic() + 10
    while (got := _replay(endpoint, start.to_bytes(8, "big"))) != expected:
        assert time.monotonic() < deadline, got
        time.sleep(0.02)
    return got


def test_a_late_subscriber_gets_what_it_missed_from_where_it_asks(
    publisher: KVEventPublisher,
) -> None:
    endpoint = publisher.replay_endpoint
    assert endpoint is not None
    _publish(publisher, 0.0, 1.0, 2.0)
    assert _replay_when(endpoint, 0, [(0, 0.0), (1, 1.0), (2, 2.0)])
    assert _replay(endpoint, (2).to_bytes(8, "big")) == [(2, 2.0)]
    assert _replay(endpoint, (3).to_bytes(8, "big")) == []  # nothing newer yet
    # A bare DEALER (no empty frame) is answered in its own envelope.
    assert _replay(endpoint, (1).to_bytes(8, "big"), envelope=False) == [(1, 1.0), (2, 2.0)]


def test_only_the_newest_batches_are_kept(publisher: KVEventPublisher) -> None:
    endpoint = publisher.replay_endpoint
    assert endpoint is not None
    _publish(publisher, *(float(i) for i in range(7)))
    assert _replay_when(endpoint, 0, [(i, float(i)) for i in range(3, 7)])


@pytest.mark.parametrize("start", [b"", b"\x00" * 3, b"\x00" * 9])
def test_a_malformed_request_gets_the_end_and_the_publisher_goes_on(
    publisher: KVEventPublisher, start: bytes
) -> None:
    endpoint = publisher.replay_endpoint
    assert endpoint is not None
    assert _replay(endpoint, start) == []
    _publish(publisher, 5.0)
    assert _replay_when(endpoint, 0, [(0, 5.0)])


def test_a_subscriber_still_gets_every_batch_live(tmp_path: Path) -> None:
    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.bind(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    publisher = KVEventPublisher(
        f"tcp://127.0.0.1:{port}", "t", replay_endpoint=f"ipc://{tmp_path}/r"
    )
    try:
        seen: list[int] = []
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:  # until the subscription is up
            _publish(publisher, 0.0)
            while sub.poll(100):
                seen.append(int.from_bytes(sub.recv_multipart()[1], "big"))
        assert seen
        _publish(publisher, 1.0, 2.0)
        while sub.poll(1000) and len(seen) < seen[0] + 3:
            seen.append(int.from_bytes(sub.recv_multipart()[1], "big"))
        assert seen[-3:] == [seen[-3], seen[-3] + 1, seen[-3] + 2]
    finally:
        publisher.close()
        sub.close(linger=0)


def test_a_taken_replay_port_is_refused_with_both_endpoints() -> None:
    port = free_port()
    taken = zmq.Context.instance().socket(zmq.ROUTER)
    taken.bind(f"tcp://*:{port}")
    try:
        with pytest.raises(KVEventsEndpointError, match=f"tcp://\\*:{port}"):
            KVEventPublisher(
                f"tcp://127.0.0.1:{free_port()}", "t", replay_endpoint=f"tcp://*:{port}"
            )
    finally:
        taken.close(linger=0)
