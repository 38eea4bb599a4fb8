"""Publishes KV-cache event batches over ZeroMQ, as vLLM's `ZmqEventPublisher` does.

Each batch goes out as a three-part message: the topic, an 8-byte big-endian sequence
number (a subscriber sees a gap when it missed one), and the msgpack batch
(engine.kv_cache.kv_events). The socket is a PUB that binds when the endpoint's host
is `*` (tcp://*:5557: subscribers connect to the engine) or the endpoint is ipc://,
and connects otherwise (tcp://indexer:5557: llm-d's indexer binds and every engine
connects to it).

The engine's step only queues a batch; a thread of its own encodes and sends, so a
slow or absent subscriber never holds a step back. PUB drops what a subscriber
cannot take (its high-water mark), and so does the queue here past `max_queue`.

Replay, as vLLM's publisher has it: with a `replay_endpoint` the thread also binds a
ROUTER there and keeps the last `buffer_steps` batches. A subscriber that joined late
or saw a gap in the sequence numbers sends the first number it wants (8 bytes, big
endian, from a REQ socket or a DEALER); it gets each kept batch from that number on
as (sequence number, payload), then an end marker: sequence number -1 with an empty
payload. A malformed request gets the end marker alone. ROUTER drops what a slow
requester cannot take, so a replay never holds the publisher back either.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import deque

import zmq

from engine.kv_cache.kv_events import KVEventBatch, encode_batch
from engine.kv_events_endpoint import KVEventsEndpointError, binds, check_endpoint

log = logging.getLogger("engine.kv_events")
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the end of a replay, as in vLLM
REPLAY_POLL_S = 0.02  # how long a replay request waits while no batch is published


class KVEventPublisher:
    """A PUB socket on its own thread; `publish` never blocks the caller."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        *,
        max_queue: int = 10_000,
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
    ) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.replay_endpoint = None if replay_endpoint is None else check_endpoint(replay_endpoint)
        self.topic = topic.encode()
        self.dropped = 0  # batches the queue was too full to take
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=max_queue)
        # (sequence number, payload) of the newest batches; only the thread touches it.
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cloister-kv-events", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)
        if self._error is not None:
            where = endpoint if self.replay_endpoint is None else f"{endpoint} or {replay_endpoint}"
            raise KVEventsEndpointError(
                f"cannot open the KV events endpoint {where!r}: {self._error}"
            )

    def publish(self, batch: KVEventBatch) -> None:
        """Queues one batch (dropped, and counted, when the queue is full)."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued (for up to `timeout_s`), then closes the socket."""
        if self._thread.is_alive():
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout_s)
            self._thread.join(timeout=timeout_s)

    def _open(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes] | None]:
        """The PUB socket, bound or connected, and the replay ROUTER (bound) if asked."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        socket: zmq.Socket[bytes] = context.socket(zmq.PUB)
        replay: zmq.Socket[bytes] | None = None
        try:
            socket.setsockopt(zmq.LINGER, 1000)
            if binds(self.endpoint):
                socket.bind(self.endpoint)
            else:
                socket.connect(self.endpoint)
            if self.replay_endpoint is not None:
                replay = context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                # A whole replay fits in the requester's queue.
                replay.setsockopt(zmq.SNDHWM, (self._kept.maxlen or 0) + 1)
                replay.bind(self.replay_endpoint)
        except zmq.ZMQError:
            socket.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return socket, replay

    def _run(self) -> None:
        try:
            socket, replay = self._open()
        except zmq.ZMQError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        seq = 0
        try:
            while True:
                if replay is None:
                    batch = self._queue.get()
                else:
                    self._answer_replays(replay)
                    try:
                        batch = self._queue.get(timeout=REPLAY_POLL_S)
                    except queue.Empty:
                        continue
                if batch is None:
                    break
                payload = encode_batch(batch)
                try:
                    socket.send_multipart((self.topic, seq.to_bytes(8, "big"), payload), copy=False)
                except zmq.ZMQError:
                    log.exception("could not send a KV events batch")
                if replay is not None:
                    self._kept.append((seq, payload))
                seq += 1
        finally:
            socket.close()
            if replay is not None:
                replay.close()

    def _answer_replays(self, replay: zmq.Socket[bytes]) -> None:
        """Answers every replay request waiting on the ROUTER, without blocking."""
        while replay.poll(0):
            frames = replay.recv_multipart()
            # [identity, b"", start] from a REQ (or a DEALER that sends the empty
            # frame), [identity, start] from a bare DEALER: answer in the same envelope.
            envelope, start = frames[:-1], frames[-1]
            if len(start) == 8:
                first = int.from_bytes(start, "big")
                for seq, payload in self._kept:
                    if seq >= first:
                        replay.send_multipart((*envelope, seq.to_bytes(8, "big"), payload))
            else:
                log.debug("a replay request of %d bytes, not 8: answered with the end", len(start))
            replay.send_multipart((*envelope, END_SEQ, b""))
