"""bench/loopback_floor.py: the machine's bare round trip that engine_hop.py prints as
a floor under the hop's added TTFT."""

from __future__ import annotations

import asyncio
import time

from bench.loopback_floor import EchoPeer, LoopbackProbe


async def _timed(port: int, hold_s: float) -> tuple[float, float]:
    probe = await LoopbackProbe.connect(port)
    try:
        start = time.perf_counter()
        figure = await probe.round_trip(hold_s)
        return figure, time.perf_counter() - start
    finally:
        probe.close()


def test_the_echo_holds_as_asked_and_the_figure_leaves_the_hold_out() -> None:
    with EchoPeer(None) as port:
        bare, bare_wall = asyncio.run(_timed(port, 0.0))
        held, held_wall = asyncio.run(_timed(port, 0.02))
    assert 0 < bare <= bare_wall
    # The echo kept the message 20 ms before answering (an echo that did not would
    # leave a negative figure); the figure is the rest of the round trip.
    assert 0 < held <= held_wall - 0.02
