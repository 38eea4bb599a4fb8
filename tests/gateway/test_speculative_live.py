"""Speculative decoding through the real processes (tiny model): `cloister engine serve
--speculative-method ngram` speculates, its /metrics and /internal/stats carry vLLM's
spec_decode series, and a `cloister serve --engine-urls` gateway shows the same figures
to operators (never anonymously) and on its admin API's engines view. A `cloister serve`
with CLOISTER_SPECULATIVE_METHOD=ngram says so at start and speculates in process.

The tiny random model's greedy answers repeat themselves, so n-gram lookup finds drafts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from admin.identity import create_admin_token
from tests.gateway import processes
from tests.gateway.engine_servers import SERVICE_TOKEN, spawn_engine, wait_ready
from tests.utils.principals import PEPPER
from tests.utils.services import stop_process
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def _value(text: str, name: str, labels: str = '{model_name="tiny"}') -> float | None:
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _complete(base_url: str, key: str) -> None:
    r = httpx.post(
        base_url + "/v1/completions",
        json={"model": "tiny", "prompt": "one two three " * 6, "max_tokens": 40,
              "temperature": 0, "ignore_eos": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 40


def _eventually(read: Callable[[], float | None], at_least: float) -> float:
    """`read()` once it reaches `at_least` (the gateway polls engine servers' stats)."""
    deadline = time.monotonic() + 30
    value = read()
    while (value is None or value < at_least) and time.monotonic() < deadline:
        time.sleep(0.3)
        value = read()
    assert value is not None and value >= at_least, value
    return value


def test_a_speculating_engine_server_reports_through_the_gateway(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "model")
    engine = spawn_engine(
        model,
        tmp_path / "engine.log",
        extra=("--speculative-method", "ngram", "--num-speculative-tokens", "3"),
    )
    try:
        wait_ready(engine)
        data_dir = tmp_path / "data"
        sessions = processes.database(data_dir)
        key = processes.create_tenant_key(sessions, "acme")
        with sessions() as s:
            admin = {"Authorization": f"Bearer {create_admin_token(s, pepper=PEPPER, role='admin').secret}"}  # fmt: skip
        config = {"engine_urls": engine.base_url, "service_token": SERVICE_TOKEN}
        with processes.gateways(data_dir, model, tmp_path / "logs", [config]) as (gw,):
            _complete(gw.base_url, key)
            own = httpx.get(engine.base_url + "/metrics", timeout=10).text
            accepted = _value(own, ACCEPTED)
            assert accepted is not None and accepted > 0, own
            drafted = _value(own, DRAFT_TOKENS)
            assert drafted is not None and accepted <= drafted
            per_pos = [
                _value(own, PER_POS, f'{{model_name="tiny",position="{i}"}}') for i in range(3)
            ]
            assert sum(v or 0 for v in per_pos) == accepted, per_pos
            # The gateway's series follow its stats poll of the engine server.
            _eventually(
                lambda: _value(
                    httpx.get(gw.base_url + "/metrics", headers=admin, timeout=10).text, ACCEPTED
                ),
                accepted,
            )
            assert "spec_decode" not in httpx.get(gw.base_url + "/metrics", timeout=10).text
            view = httpx.get(gw.base_url + "/admin/api/v1/engines", headers=admin, timeout=10)
            assert view.status_code == 200, view.text
            [replica] = view.json()["models"][0]["replicas"]
            spec = replica["speculative"]
            assert spec["num_accepted_tokens"] >= accepted
            assert spec["acceptance_rate"] == pytest.approx(
                spec["num_accepted_tokens"] / spec["num_draft_tokens"]
            )
            assert spec["mean_accepted_length"] > 1
    finally:
        stop_process(engine.proc)


def test_cloister_serve_speculates_in_process_and_says_so(tmp_path: Path) -> None:
    model = make_tiny_model_dir(tmp_path / "model")
    data_dir = tmp_path / "data"
    sessions = processes.database(data_dir)
    key = processes.create_tenant_key(sessions, "acme")
    with sessions() as s:
        admin = {"Authorization": f"Bearer {create_admin_token(s, pepper=PEPPER, role='admin').secret}"}  # fmt: skip
    configs = [{"speculative_method": "ngram"}, {}]
    with processes.gateways(data_dir, model, tmp_path / "logs", configs) as (spec, plain):
        assert "speculative decoding on (ngram, up to 4 draft tokens a step" in spec.logs()
        assert "speculative decoding off" in plain.logs()
        for gw in (spec, plain):
            _complete(gw.base_url, key)
        text = httpx.get(spec.base_url + "/metrics", headers=admin, timeout=10).text
        assert (_value(text, ACCEPTED) or 0) > 0, text
        text = httpx.get(plain.base_url + "/metrics", headers=admin, timeout=10).text
        # No sample while speculation is off (the families' HELP lines only).
        assert not [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode")]
        views = {
            gw: httpx.get(gw.base_url + "/admin/api/v1/engines", headers=admin, timeout=10).json()
            for gw in (spec, plain)
        }
        assert views[spec]["models"][0]["replicas"][0]["speculative"]["num_drafts"] > 0
        assert views[plain]["models"][0]["replicas"][0]["speculative"] is None
