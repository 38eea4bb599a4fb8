"""A live gateway's observability (issue 19, sections 5 and 6): every panel of vLLM's
Grafana dashboard finds its series on /metrics, and each request leaves one access line
with its figures and no secret, in the JSON and the console format alike."""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.logging_setup import make_handler
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import OPERATOR_HEADERS, LiveGateway, make_test_engine, start_gateway
from tests.utils.principals import PEPPER

QUERIES = Path(__file__).parent / "data" / "vllm_dashboard_queries.json"
METRIC_NAME = re.compile(r"vllm:[a-zA-Z0-9_:]+")
ACCESS_FIELDS = (
    "request_id",
    "tenant",
    "key_id",
    "model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "ttft_s",
    "latency_s",
)
BAD_KEY = "sk-clo-not-a-real-key-0123456789abcdef"


class TerminalStream(io.StringIO):
    """A stream that says it is a terminal, as stderr does in a shell."""

    def isatty(self) -> bool:
        """Always a terminal."""
        return True


class Served:
    """The live gateway, the key used, and what the console handler wrote."""

    def __init__(self, gw: LiveGateway, key: str, console: TerminalStream) -> None:
        self.gw = gw
        self.key = key
        self.console = console

    def json_lines(self) -> list[dict[str, Any]]:
        """Every JSON log line so far, parsed (each line must parse)."""
        return [json.loads(line) for line in self.gw.logs.getvalue().splitlines() if line]

    def scrape(self, *, operator: bool = False) -> str:
        """/metrics, as an anonymous scraper sees it (or, `operator`, as the deployment's
        Prometheus does, with a viewer token)."""
        headers = OPERATOR_HEADERS if operator else None
        r = httpx.get(self.gw.base_url + "/metrics", headers=headers, timeout=30)
        assert r.status_code == 200
        return r.text


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One live gateway on the tiny model; a few requests made, streamed and not; a
    second handler writes the console format to a terminal-like stream."""
    tmp = tmp_path_factory.mktemp("observability")
    gw, stop = start_gateway(tmp, engine=make_test_engine(tmp), limiter=MemoryLimiter())
    console = TerminalStream()
    handler = make_handler(console)
    logging.getLogger().addHandler(handler)
    try:
        key = gw.tenant("initech")
        client = gw.client(key)
        for i in range(3):
            client.chat.completions.create(
                model=gw.model,
                messages=[{"role": "user", "content": f"hello number {i}"}],
                max_tokens=4,
            )
        stream = client.chat.completions.create(
            model=gw.model,
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        for _ in stream:
            pass
        client.completions.create(model=gw.model, prompt="plain text", max_tokens=3, n=2)
        r = httpx.post(
            gw.base_url + "/v1/chat/completions",
            json={"model": gw.model, "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {BAD_KEY}"},
            timeout=30,
        )
        assert r.status_code == 401
        r = httpx.get(gw.base_url + "/metrics", headers=OPERATOR_HEADERS, timeout=30)
        assert r.status_code == 200
        yield Served(gw, key, console)
    finally:
        logging.getLogger().removeHandler(handler)
        stop()


def _series(text: str) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it has in the exposition `text`."""
    found: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(dict(sample.labels))
    return found


def _dashboard_metrics() -> set[str]:
    spec = json.loads(QUERIES.read_text())
    exprs = [e for panel in spec["panels"] for e in panel["exprs"]]
    assert len(spec["panels"]) == 12
    exprs += spec["also_read"]["exprs"]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def test_every_dashboard_query_has_a_series_of_the_model(served: Served) -> None:
    names = _dashboard_metrics()
    assert "vllm:request_prefill_time_seconds_sum" in names  # the fixture was read whole
    # The dashboard's Prometheus scrapes with a token: prefix-cache hits are operators' only.
    series = _series(served.scrape(operator=True))
    missing = sorted(n for n in names if not series.get(n))
    assert not missing, f"no series for {missing}"
    unlabelled = sorted(
        n for n in names if not any(s.get("model_name") == served.gw.model for s in series[n])
    )
    assert not unlabelled, f"no model_name={served.gw.model!r} series for {unlabelled}"


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_token_counters_and_request_histograms_match_the_usage_records(served: Served) -> None:
    records = [r for r in served.gw.usage.records if r.status == 200]
    prompt = sum(r.prompt_tokens for r in records)
    completion = sum(r.completion_tokens for r in records)
    assert prompt > 0 and completion > 0
    deadline = time.monotonic() + 10
    text = served.scrape()
    # The engine's counters reach the gateway with its next step report.
    while _value(text, "vllm:prompt_tokens_total") != prompt and time.monotonic() < deadline:
        time.sleep(0.05)
        text = served.scrape()
    assert _value(text, "vllm:prompt_tokens_total", model_name="tiny") == prompt
    # The engine also counts tokens it hides (an EOS), so at least what clients got.
    assert _value(text, "vllm:generation_tokens_total", model_name="tiny") >= completion
    # 3 chat requests, 1 streamed, 1 completion with n=2: six finished samples.
    assert _value(text, "vllm:request_success_total") == 6
    assert _value(text, "vllm:request_generation_tokens_sum") == completion
    assert _value(text, "vllm:request_generation_tokens_count") == 6
    assert _value(text, "vllm:request_max_num_generation_tokens_sum") == 3 * 4 + 5 + 2 * 3
    assert _value(text, "vllm:request_prefill_time_seconds_count") == 6
    assert _value(text, "vllm:request_decode_time_seconds_count") == 6
    info = _series(text)["vllm:cache_config_info"]
    assert info == [
        {"model_name": "tiny", "block_size": "16", "num_gpu_blocks": "256", "cache_dtype": "auto"}
    ]


def test_one_access_line_per_request_with_its_figures(served: Served) -> None:
    lines = [line for line in served.json_lines() if line["logger"] == "cloister.access"]
    by_id = {line["request_id"]: line for line in lines}
    assert len(by_id) == len(lines)  # one line per request
    records = served.gw.usage.records
    key_id = served.gw.key_id(served.key)
    for record in records:
        line = by_id[record.request_id]
        for field in ACCESS_FIELDS:
            assert field in line, field
        assert line["tenant"] == "initech" and line["key_id"] == key_id
        assert line["model"] == "tiny" and line["status"] == record.status
        assert line["prompt_tokens"] == record.prompt_tokens
        assert line["completion_tokens"] == record.completion_tokens
        assert line["cached_tokens"] == record.cached_tokens
        assert line["latency_s"] > 0 and line["ttft_s"] > 0
    refused = [line for line in lines if line["status"] == 401]
    assert len(refused) == 1 and refused[0]["tenant"] is None
    assert len(lines) == len(records) + 1
    console = served.console.getvalue()
    assert all(f"request_id={r.request_id} " in console for r in records)
    assert "tenant=initech" in console and f"key_id={key_id}" in console


def test_logs_are_json_lines_and_console_lines_without_secrets(served: Served) -> None:
    text = served.gw.logs.getvalue()
    lines = served.json_lines()  # each line parses
    assert any(line["logger"].startswith("uvicorn") for line in lines)  # uvicorn's own too
    assert "\x1b" not in text and "\\u001b" not in text and "color_message" not in text
    console = served.console.getvalue()
    assert console and not console.lstrip().startswith("{")
    assert re.search(r"^\d\d:\d\d:\d\d .*cloister\.access: request done", console, re.M)
    secrets = [*served.gw.secrets, BAD_KEY, PEPPER, OPERATOR_HEADERS["Authorization"]]
    secrets.append(OPERATOR_HEADERS["Authorization"].removeprefix("Bearer "))
    for secret in secrets:
        assert secret not in text, secret
        assert secret not in console, secret
