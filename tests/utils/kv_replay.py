"""Asks a KV events replay socket (engine/kv_events_publisher.py) for its batches."""

from __future__ import annotations

import zmq

from engine.kv_events_publisher import END_SEQ


def replay(endpoint: str, start: bytes, *, envelope: bool = True) -> list[tuple[int, bytes]]:
    """(sequence number, payload) of each batch `endpoint` replays from `start` (8 bytes,
    big-endian, when well formed), up to the end marker.

    With `envelope` the request is sent as a REQ socket sends it (an empty frame first),
    which is how vLLM's example subscriber asks; read from a DEALER, since a REQ socket
    takes one reply per request. Without it, as a bare DEALER.
    """
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(endpoint)
    head = [b""] if envelope else []
    got: list[tuple[int, bytes]] = []
    try:
        socket.send_multipart([*head, start])
        while socket.poll(5000):
            frames = socket.recv_multipart()
            assert frames[: len(head)] == head, frames  # the envelope comes back
            seq, payload = frames[len(head) :]
            if seq == END_SEQ:
                assert payload == b""
                return got
            got.append((int.from_bytes(seq, "big"), payload))
    finally:
        socket.close(linger=0)
    raise AssertionError(f"no end marker after {len(got)} batches")
