"""The machine's floor under a hop: bare asyncio round trips over loopback TCP between
two processes, with no HTTP, WebSocket or engine on either side.

bench/engine_hop.py compares the gateway's remote engine client with the in-process
one. A request's first token needs one round trip between the two processes (the
submit out, the first token back), so what a bare round trip costs between the same
CPUs, in the same minutes, is a floor under the TTFT the hop adds that no code above
the socket can go below. The echo keeps its CPU busy before it answers for as long as
it is asked (engine_hop.py asks for the in-process engine's time to a first token), so
that the caller's CPU goes idle as a gateway's does while the engine steps; the figure
leaves that time out. On a virtual machine the floor is large and moves: waking an
idle virtual CPU and each loopback syscall cost more there than on bare metal, and
more again while the host is busy (steal time). engine_hop.py takes these round trips
in turns with its requests and prints their p50 beside the hop's figures.
"""

from __future__ import annotations

import asyncio
import os
import struct
import subprocess
import sys
import time
from types import TracebackType

SIZE = 256  # bytes a round trip carries each way: about a submit frame's size
_HOLD = struct.Struct("<d")  # the message's first bytes: how long the echo waits


class _Echo(asyncio.Protocol):
    """Sends each message back after keeping its CPU busy for as long as the message
    asks, as an engine's step does before a first token goes back."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= SIZE:
            message, self.buffer = self.buffer[:SIZE], self.buffer[SIZE:]
            # A busy wait: a timer would sleep (and round up to epoll's whole milliseconds).
            end = time.perf_counter() + _HOLD.unpack_from(message)[0]
            while time.perf_counter() < end:
                pass
            self.transport.write(message)


async def _serve_echo() -> None:
    server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)  # the parent reads the port
    await server.serve_forever()


class EchoPeer:
    """An echo server in a child process on `cpus` (None: any CPU); entering it starts
    the child and gives its port, leaving it stops the child."""

    def __init__(self, cpus: set[int] | None) -> None:
        self.cpus = cpus
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> int:
        cpus = self.cpus
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdout=subprocess.PIPE,
            # Pinned before it starts, as the engine server is.
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )
        assert self._proc.stdout is not None
        return int(self._proc.stdout.readline())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()


class _Answers(asyncio.Protocol):
    """Counts the bytes that come back, and wakes whoever waits for a whole echo."""

    def __init__(self) -> None:
        self.waiter: asyncio.Future[None] | None = None
        self.expected = 0

    def data_received(self, data: bytes) -> None:
        self.expected -= len(data)
        if self.expected <= 0 and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class LoopbackProbe:
    """One connection to an `EchoPeer`; each `round_trip` times one echo."""

    def __init__(self, transport: asyncio.Transport, answers: _Answers) -> None:
        self._transport, self._answers = transport, answers

    @classmethod
    async def connect(cls, port: int) -> LoopbackProbe:
        """Connects to the echo server on `port`."""
        transport, answers = await asyncio.get_running_loop().create_connection(
            _Answers, "127.0.0.1", port
        )
        return cls(transport, answers)

    async def round_trip(self, hold_s: float = 0.0) -> float:
        """Seconds from writing a message until all of it has come back, less the
        `hold_s` the echo kept it (busy) before sending it back."""
        answers = self._answers
        answers.waiter = asyncio.get_running_loop().create_future()
        answers.expected = SIZE
        message = _HOLD.pack(hold_s).ljust(SIZE, b"x")
        start = time.perf_counter()
        self._transport.write(message)
        await answers.waiter
        return time.perf_counter() - start - hold_s

    def close(self) -> None:
        """Closes the connection."""
        self._transport.close()


if __name__ == "__main__":
    asyncio.run(_serve_echo())
