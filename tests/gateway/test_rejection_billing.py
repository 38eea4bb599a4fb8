"""Refused requests are recorded with their status and bill nothing; engine failures are
recorded as engine failures (issue 13, defect 3)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from admin import registry
from admin.billing_export import build_statement, render_statement
from admin.metering import usage_row
from admin.usage_store import write_usage
from tenancy.db import make_engine, make_session_factory
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.engine_faults import fail_after, refuse
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

MESSAGES = [{"role": "user", "content": "hello there"}]
PRICES = registry.Prices(input=150_000, cached_input=75_000, output=600_000)
ILLEGAL_ACCESS = "CUDA error: an illegal memory access was encountered"


@pytest.fixture
def fake_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    gw, stop = start_gateway(tmp_path, engine=gateway_test_engine(), limiter=MemoryLimiter())
    yield gw
    stop()


@pytest.fixture
def failing_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """Requests fail inside the engine after 3 tokens."""
    engine = gateway_test_engine()
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    with fail_after(engine, 3, lambda: RuntimeError(ILLEGAL_ACCESS)):
        yield gw
    stop()


def _post(gw: LiveGateway, key: str, **body: Any) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "tiny", "messages": MESSAGES, **body},
        timeout=30,
    )


def _export(gw: LiveGateway, tmp_path: Path) -> tuple[list[dict[str, str]], list[dict[str, Any]]]:
    """The gateway's usage records stored as metering stores them, exported as CSV and JSONL."""
    sessions = make_session_factory(make_engine(f"sqlite:///{tmp_path / 'cloister.db'}"))
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    with sessions() as s:
        registry.register_model(
            s, name="tiny", source="/m", format="gguf", context_length=8, prices=PRICES, now=start
        )
        write_usage(s, [usage_row(r, dt.datetime.now(dt.UTC)) for r in gw.usage.records])
        statement = build_statement(s, period=dt.datetime.now(dt.UTC).strftime("%Y-%m"))
    rows = list(csv.DictReader(io.StringIO(render_statement(statement, "csv"))))
    jsonl = [json.loads(x) for x in render_statement(statement, "jsonl").splitlines()]
    lines = [r for r in rows if r["record"] == "line"]
    return lines, [r for r in jsonl if r["record"] == "line"]


def test_refused_requests_are_recorded_with_zero_billable_tokens(
    fake_gateway: LiveGateway, tmp_path: Path
) -> None:
    gw = fake_gateway
    quota = gw.tenant("quota", token_budget=60, budget_period="day")
    rate = gw.tenant("rate", rpm=1)
    busy = gw.tenant("busy")
    assert _post(gw, quota, max_tokens=8).status_code == 200
    refused = [_post(gw, quota, max_tokens=8) for _ in range(5)]  # retries over the quota
    assert {r.status_code for r in refused} == {429}
    assert refused[0].json()["error"]["code"] == "insufficient_quota"
    assert _post(gw, rate, max_tokens=4).status_code == 200
    assert _post(gw, rate, max_tokens=4).status_code == 429
    with refuse(gw.engine):  # the engine's queue is full: 503
        assert _post(gw, busy, max_tokens=4).status_code == 503

    records = gw.usage.records
    assert len(records) == 9
    rejected = [r for r in records if r.status != 200]
    assert sorted(r.status for r in rejected) == [429] * 6 + [503]
    for r in rejected:
        assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (0, 0, 0), r
    for r in records:
        if r.status == 200:
            assert r.prompt_tokens > 0 and r.completion_tokens > 0

    rows, jsonl = _export(gw, tmp_path)
    for lines in (rows, jsonl):
        by_status: dict[int, list[Any]] = {}
        for line in lines:
            by_status.setdefault(int(line["status"]), []).append(line)
        assert set(by_status) == {200, 429, 503}
        assert sum(int(x["requests"]) for x in by_status[429]) == 6
        assert sum(int(x["requests"]) for x in by_status[503]) == 1
        for line in by_status[429] + by_status[503]:
            tokens = (line["input_tokens"], line["cached_input_tokens"], line["output_tokens"])
            assert tuple(int(t) for t in tokens) == (0, 0, 0)
            assert line["section"] == "not_billed"
            assert line["total_usd"] == "0.000000000000"
        assert all(x["section"] == "billable" for x in by_status[200])
        assert all(Decimal(x["total_usd"]) > 0 for x in by_status[200])


def test_a_refused_request_refunds_its_budget_reservation(fake_gateway: LiveGateway) -> None:
    gw = fake_gateway
    key = gw.tenant("acme", token_budget=100, budget_period="day")
    with refuse(gw.engine):
        for _ in range(10):  # each reserves prompt + max_tokens, then the engine refuses it
            assert _post(gw, key, max_tokens=40).status_code == 503
    assert _post(gw, key, max_tokens=40).status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_an_engine_failure_is_recorded_as_one(failing_gateway: LiveGateway, stream: bool) -> None:
    gw = failing_gateway
    key = gw.tenant("acme")
    r = _post(gw, key, max_tokens=50, stream=stream)
    if stream:
        assert r.status_code == 200
        assert '"error"' in r.text and "[DONE]" not in r.text
    else:
        assert r.status_code == 500
    deadline = time.monotonic() + 10  # a cut stream is settled just after its last byte
    while not gw.usage.records and time.monotonic() < deadline:
        time.sleep(0.01)
    (record,) = gw.usage.records
    assert record.status == 500
    assert record.finish_reason == "engine_error"
    assert not record.client_disconnected
    assert record.completion_tokens == 3  # what the engine produced before it failed
