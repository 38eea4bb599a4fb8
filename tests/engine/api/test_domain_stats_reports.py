"""Per-domain cache counters travel in engine reports only when due, yet stats() stays exact.

The loop puts every cache domain's counters in its first report, in the report that
leaves the engine idle, and otherwise at most every `DOMAIN_STATS_INTERVAL_S`; the
front keeps the last ones it received.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib
from collections.abc import Awaitable, Callable

import pytest

from engine import AsyncEngine, SamplingParams
from engine.fronts import core_loop
from engine.fronts.async_engine import EngineFront, RequestStream
from engine.fronts.core_loop import StepReport
from engine.fronts.process_engine import ProcessEngine
from engine.llm_engine import LLMEngine
from engine.stats import EngineStats
from tests.utils.engine_requests import make_request

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
# Three whole blocks of 16: the second lookup of this prompt in its domain hits.
PROMPT_A = [5 + i for i in range(50)]
PROMPT_B = [300 + i for i in range(40)]


def _record(front: EngineFront) -> list[tuple[StepReport, EngineStats]]:
    """Every report the front receives, in order, with its `stats()` just after it."""
    reports: list[tuple[StepReport, EngineStats]] = []
    handle = front._on_report

    def on_report(report: StepReport) -> None:
        handle(report)
        reports.append((report, front.stats()))

    front._on_report = on_report  # type: ignore[method-assign]
    return reports


async def _drain(stream: RequestStream) -> int:
    return sum([len(d.token_ids) async for ev in stream for d in ev.deltas])


async def _a_and_b(front: EngineFront) -> list[int]:
    """PROMPT_A in domain t:a and PROMPT_B in t:b at once; the tokens each produced."""
    a = front.submit(make_request(PROMPT_A, GREEDY, cache_domain="t:a"))
    b = front.submit(make_request(PROMPT_B, GREEDY, cache_domain="t:b"))
    return list(await asyncio.gather(_drain(a), _drain(b)))


def _serve(front: EngineFront, body: Callable[[], Awaitable[object]]) -> None:
    """Starts `front`, awaits `body()`, shuts the front down."""

    async def main() -> None:
        await front.start()
        try:
            await body()
        finally:
            await front.shutdown()

    asyncio.run(main())


@pytest.fixture
def tiny_engine(tiny_model: pathlib.Path) -> AsyncEngine:
    return AsyncEngine.from_options(str(tiny_model), num_blocks=128, attention_backend="torch")


def test_domains_only_in_first_and_idle_reports(
    tiny_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An interval no run reaches: only the first and the idle reports may carry domains.
    monkeypatch.setattr(core_loop, "DOMAIN_STATS_INTERVAL_S", 3600.0)
    recorded = _record(tiny_engine)

    async def bursts() -> None:
        assert await _a_and_b(tiny_engine) == [8, 8]
        again = tiny_engine.submit(make_request(PROMPT_A, GREEDY, cache_domain="t:a"))
        assert await _drain(again) == 8

    _serve(tiny_engine, bursts)

    reports = [r for r, _ in recorded]
    assert reports[0].domains_included
    idle = [i for i, r in enumerate(reports) if r.stats.num_running + r.stats.num_waiting == 0]
    assert len(idle) == 2  # the end of each burst
    for i, report in enumerate(reports):
        if i == 0 or i in idle:
            assert report.domains_included, i
        else:
            assert not report.domains_included, i
            assert report.stats.prefix_cache_domains == {}
    # One report per decode step: most of them were there to hold the domains back.
    assert sum(not r.domains_included for r in reports) >= GREEDY.max_tokens

    # After a report without domains, the front shows the last ones it received.
    last = reports[0].stats.prefix_cache_domains
    for report, shown in recorded:
        if report.domains_included:
            last = report.stats.prefix_cache_domains
        assert shown.prefix_cache_domains == last
        assert shown.num_running == report.stats.num_running
    # In the second burst that is the first one's end: t:a was looked up once.
    second_burst = recorded[idle[0] + 1 : idle[1]]
    assert second_burst
    assert all(shown.prefix_cache_domains["t:a"].queries == 1 for _, shown in second_burst)

    domains = tiny_engine.stats().prefix_cache_domains
    assert domains == tiny_engine.engine.kv.domain_stats()
    assert domains["t:a"].queries == 2 and domains["t:a"].hits == 1
    assert domains["t:a"].cached_tokens == 48  # three whole blocks of PROMPT_A
    assert domains["t:b"].queries == 1 and domains["t:b"].hits == 0
    # The gauges are the latest report's, not the ones of the report that carried domains.
    assert tiny_engine.stats().num_requests_finished == 3


def test_domains_included_while_running_once_the_interval_elapsed(
    tiny_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(core_loop, "DOMAIN_STATS_INTERVAL_S", 0.0)
    recorded = _record(tiny_engine)

    _serve(tiny_engine, functools.partial(_a_and_b, tiny_engine))
    reports = [r for r, _ in recorded]

    # Every report follows a step, so with the interval always elapsed each carries them.
    assert all(r.domains_included for r in reports)
    running = [r for r in reports if r.stats.num_running > 0]
    assert running
    assert {"t:a", "t:b"} <= set(running[-1].stats.prefix_cache_domains)


def test_process_engine_delivers_domains(tiny_model: pathlib.Path) -> None:
    factory = functools.partial(
        LLMEngine.from_options, str(tiny_model), num_blocks=64, attention_backend="torch"
    )
    engine = ProcessEngine(factory)
    # The child's first message carries its full stats (no domain seen yet).
    assert engine.stats().prefix_cache_domains == {}
    recorded = _record(engine)

    async def two_rounds() -> None:
        for _ in range(2):
            await _a_and_b(engine)

    _serve(engine, two_rounds)

    assert recorded[-1][0].domains_included  # the report that left the child idle
    domains = engine.stats().prefix_cache_domains
    assert domains["t:a"].queries == 2 and domains["t:a"].hits == 1
    assert domains["t:b"].queries == 2 and domains["t:b"].hits == 1
