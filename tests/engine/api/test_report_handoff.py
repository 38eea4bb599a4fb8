"""Each step's report reaches the caller's loop before the engine steps on.

AsyncEngine: the engine thread lets the loop route the report, but never waits on a busy
loop for longer than the bound. ProcessEngine: the child yields its CPU after each report,
so a parent on the same CPU reads the reports one by one, as they are made."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import Any

import pytest

from engine import AsyncEngine, SamplingParams
from engine.fronts.async_engine import EngineFront
from engine.fronts.process_engine import ProcessEngine
from tests.utils.engine_requests import make_request
from tests.utils.fast_fake_model import fast_fake_llm_engine

TOKENS = 20
PROCESS_TOKENS = 64


class Counted:
    """Counts an AsyncEngine's routed reports, and notes the count as each step starts."""

    def __init__(self, front: AsyncEngine) -> None:
        self.routed = 0
        self.at_step_start: list[int] = []
        route, step = front._route, front.engine.step

        def counting_route(report: Any, routed: Any) -> None:
            self.routed += 1
            route(report, routed)

        def noting_step() -> Any:
            self.at_step_start.append(self.routed)
            return step()

        front._route = counting_route  # type: ignore[method-assign]
        front.engine.step = noting_step  # type: ignore[method-assign]


async def _stream_tokens(front: EngineFront, request_id: str, max_tokens: int = TOKENS) -> int:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    stream = front.submit(make_request([5, 6, 7], params, request_id=request_id))
    return sum(len(d.token_ids) for event in [e async for e in stream] for d in event.deltas)


def test_each_step_starts_after_the_loop_routed_the_reports_before_it() -> None:
    # A bound far above any wait, so that the order is certain: without the hand-off the
    # engine thread starts its next step as soon as it has woken the loop.
    # Steps in turn: one step a token (with overlap scheduling a step reports the token
    # of the step launched before it, one step later).
    front = AsyncEngine(fast_fake_llm_engine(overlap_scheduling=False), report_handoff_s=30.0)
    counted = Counted(front)

    async def main() -> int:
        await front.start()
        try:
            return await _stream_tokens(front, "handed-off")
        finally:
            await front.shutdown()

    assert asyncio.run(main()) == TOKENS
    steps = counted.at_step_start
    assert len(steps) == TOKENS  # one step a token, each with one report
    # Step k starts once the k reports of the steps before it were routed.
    assert steps == list(range(TOKENS))


def test_a_busy_loop_holds_the_engine_up_by_at_most_the_bound() -> None:
    # The default bound, REPORT_HANDOFF_S; steps in turn, one step a token.
    front = AsyncEngine(fast_fake_llm_engine(overlap_scheduling=False))
    counted = Counted(front)

    async def main() -> tuple[int, int]:
        await front.start()
        try:
            task = asyncio.ensure_future(_stream_tokens(front, "busy-loop"))
            await asyncio.sleep(0)  # the request is submitted
            # The loop is busy (time.sleep lets the engine thread have the GIL) and routes
            # nothing: the engine must make every token meanwhile, waiting at most
            # REPORT_HANDOFF_S a step for a hand-off that does not come.
            time.sleep(1.0)
            steps_while_busy = len(counted.at_step_start)
            return steps_while_busy, await task
        finally:
            await front.shutdown()

    steps_while_busy, tokens = asyncio.run(main())
    assert steps_while_busy == TOKENS
    assert tokens == TOKENS  # and every token reached the stream once the loop was free


@pytest.mark.parametrize("bad", [-0.001, float("nan")])
def test_a_negative_or_nan_bound_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="report_handoff_s"):
        AsyncEngine(fast_fake_llm_engine(), report_handoff_s=bad)


@pytest.mark.serial
def test_an_engine_process_on_the_servers_cpu_lets_it_take_each_report() -> None:
    # Both on one CPU: without the yield, the child steps on through its time slice after
    # each report and the parent reads the tokens in bunches, the first with the last.
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # this thread, and the child spawned from it
    try:
        front = ProcessEngine(functools.partial(fast_fake_llm_engine))
        per_wakeup: list[int] = []
        reports = 0
        on_readable, on_report = front._on_readable, front._on_report

        def counting_report(report: Any) -> None:
            nonlocal reports
            reports += 1
            on_report(report)

        def counting_readable() -> None:
            nonlocal reports
            reports = 0
            on_readable()
            if reports:
                per_wakeup.append(reports)

        front._on_report = counting_report  # type: ignore[method-assign]
        front._on_readable = counting_readable  # type: ignore[method-assign]

        async def main() -> int:
            await front.start()
            try:
                return await _stream_tokens(front, "process", max_tokens=PROCESS_TOKENS)
            finally:
                await front.shutdown()

        assert asyncio.run(main()) == PROCESS_TOKENS
    finally:
        os.sched_setaffinity(0, cpus)
    # One report a read, as sent (two may meet when the parent was slow to wake). The
    # first read may find a few more: the child starts stepping while the parent is still
    # on its way from submit to its first wait (three, once, in a run right after the
    # parallel part of the suite). Without the yield the reads come in bunches of many.
    assert len(per_wakeup) >= PROCESS_TOKENS // 2, per_wakeup
    assert per_wakeup[0] <= 4, per_wakeup
    assert max(per_wakeup[1:]) <= 2, per_wakeup


def test_a_callback_after_each_report_sees_its_events_already_delivered() -> None:
    front = AsyncEngine(fast_fake_llm_engine())
    delivered: list[Any] = []
    seen_at_call: list[int] = []
    front.after_each_report(lambda: seen_at_call.append(len(delivered)))

    async def main() -> None:
        await front.start()
        try:
            params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
            stream = front.submit(make_request([5, 6, 7], params, request_id="observed"))
            done = asyncio.get_running_loop().create_future()

            def listener(item: Any) -> None:
                delivered.append(item)
                if item.finished:
                    done.set_result(None)

            stream.listen(listener)
            await asyncio.wait_for(done, 30)
        finally:
            await front.shutdown()

    asyncio.run(main())
    assert len(delivered) == TOKENS
    # Called once a report (an idle report at the end may repeat the count), each time
    # after that report's event reached the listener.
    assert sorted(set(seen_at_call)) == list(range(1, TOKENS + 1))
    assert seen_at_call == sorted(seen_at_call)
