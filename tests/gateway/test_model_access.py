"""ModelAccess: the registry's allow-lists from memory, re-read off the loop, kept when the
registry is down (issue 14 §2)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from gateway.model_access import AccessMap, ModelAccess


class Registry:
    """A reader whose answer, failure and thread the test controls."""

    def __init__(self, answer: AccessMap) -> None:
        self.answer = answer
        self.fail = False
        self.reads = 0
        self.threads: set[str] = set()

    def __call__(self) -> AccessMap:
        self.reads += 1
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise ConnectionError("registry down")
        return self.answer


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_answers_from_memory_then_rereads_off_the_loop_when_stale() -> None:
    async def main() -> None:
        reg = Registry({"m": frozenset({"ten_a"})})
        clock = Clock()
        access = ModelAccess(reg, reg(), refresh_s=10.0, clock=clock)
        reg.reads, reg.threads = 0, set()  # the initial read was this test's
        snap = await access.current()
        assert reg.reads == 0  # fresh: from memory
        assert snap.allows("m", "ten_a") and not snap.allows("m", "ten_b")
        assert snap.allows("unlisted", "ten_b")  # the registry does not restrict it
        reg.answer = {"m": None}
        clock.now += 11  # stale: the next answer waits for one read
        snap = await access.current()
        assert reg.reads == 1 and snap.allows("m", "ten_b")
        assert reg.threads == {"cloister-models_0"}  # never the event loop's thread
        reg.answer = {"m": frozenset()}
        clock.now += 6  # half-stale: answered at once, re-read in the background
        assert (await access.current()).allows("m", "ten_b")
        await asyncio.sleep(0.1)
        assert reg.reads == 2 and not access.snapshot.allows("m", "ten_a")
        access.close()

    asyncio.run(main())


def test_a_registry_outage_keeps_the_last_answer_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        reg = Registry({"m": frozenset({"ten_a"})})
        clock = Clock()
        access = ModelAccess(reg, reg(), refresh_s=1.0, retry_s=5.0, clock=clock)
        reg.fail = True
        clock.now += 2
        with caplog.at_level(logging.WARNING, logger="cloister.gateway"):
            snap = await access.current()
        assert not snap.allows("m", "ten_b") and snap.allows("m", "ten_a")  # the last answer
        assert "model registry unavailable (ConnectionError)" in caplog.text
        reads = reg.reads
        for _ in range(5):  # within retry_s nobody waits on the registry again
            await access.current()
        assert reg.reads == reads
        reg.fail = False
        reg.answer = {"m": None}
        clock.now += 6
        assert (await access.current()).allows("m", "ten_b")  # back: the new answer
        access.close()

    asyncio.run(main())


def test_a_stalled_registry_read_times_out_to_the_last_answer() -> None:
    release = threading.Event()

    def stalled() -> AccessMap:
        release.wait(5)
        return {"m": None}

    async def main() -> None:
        clock = Clock()
        access = ModelAccess(
            stalled, {"m": frozenset({"ten_a"})}, refresh_s=1.0, read_timeout_s=0.2, clock=clock
        )
        clock.now += 2
        snap = await access.current()
        assert not snap.allows("m", "ten_b")  # waited 0.2 s, then the last answer
        release.set()
        await asyncio.sleep(0.1)
        assert access.snapshot.allows("m", "ten_b")  # the late read still lands
        access.close()

    asyncio.run(main())
