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
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading

import zmq

from engine.kv_cache.kv_events import KVEventBatch, encode_batch
from engine.kv_events_endpoint import KVEventsEndpointError, binds, check_endpoint

log = logging.getLogger("engine.kv_events")


class KVEventPublisher:
    """A PUB socket on its own thread; `publish` never blocks the caller."""

    def __init__(self, endpoint: str, topic: str, *, max_queue: int = 10_000) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.topic = topic.encode()
        self.dropped = 0  # batches the queue was too full to take
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=max_queue)
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cloister-kv-events", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)
        if self._error is not None:
            raise KVEventsEndpointError(
                f"cannot open the KV events endpoint {endpoint!r}: {self._error}"
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

    def _run(self) -> None:
        socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        try:
            socket.setsockopt(zmq.LINGER, 1000)
            if binds(self.endpoint):
                socket.bind(self.endpoint)
            else:
                socket.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self._error = exc
            socket.close(linger=0)
            self._ready.set()
            return
        self._ready.set()
        seq = 0
        try:
            while (batch := self._queue.get()) is not None:
                try:
                    socket.send_multipart(
                        (self.topic, seq.to_bytes(8, "big"), encode_batch(batch)), copy=False
                    )
                except zmq.ZMQError:
                    log.exception("could not send a KV events batch")
                seq += 1
        finally:
            socket.close()
