"""Pickled messages over a stream socket, each behind an 8-byte length.

The engine process and its parent talk through a socket pair. multiprocessing's
`Connection` would frame the messages too, but its reads cost a `poll` (which
builds a selector each call) and two `read`s per message; the parent receives one
message per engine step, so that was most of its cost per request. Here the
reader takes whatever bytes have arrived in one call and cuts every complete
message out of them (`FrameDecoder`), which fits an asyncio protocol's
`data_received` as well as a blocking `recv` loop.
"""

from __future__ import annotations

import pickle
import struct

_LENGTH = struct.Struct("!Q")


def encode_frame(message: object) -> bytes:
    """`message` pickled, behind its length: one `write` sends it whole."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class FrameDecoder:
    """Turns a byte stream back into the messages `encode_frame` made, in order."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """Adds `data`; returns every message now complete (a partial one waits)."""
        buffer = self._buffer
        buffer += data
        messages: list[object] = []
        start = 0
        header = _LENGTH.size
        while len(buffer) - start >= header:
            (length,) = _LENGTH.unpack_from(buffer, start)
            end = start + header + length
            if end > len(buffer):
                break
            messages.append(pickle.loads(buffer[start + header : end]))
            start = end
        del buffer[:start]
        return messages

    @property
    def pending_bytes(self) -> int:
        """Bytes of a message not complete yet."""
        return len(self._buffer)
