"""`cloister serve` with an ITL budget (`itl_budget_ms`): the engine caps each step's prompt
tokens from its measured step costs, operators see the cap on /metrics, and requests are
served and metered as without it (issue 17, seed §7)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.utils.built_app import tiny_model_app

CAP_SERIES = re.compile(r'^cloister_engine_prefill_token_cap\{model_name="tiny"\} (\S+)$', re.M)


def serve(tmp_path: Path, **engine: object) -> tuple[TestClient, str]:
    """The real app on a tiny random-weight model, one tenant key."""
    return tiny_model_app(tmp_path, **engine)


@pytest.fixture
def budgeted(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    client, key = serve(tmp_path, itl_budget_ms=0.001)  # no step fits: the cap's floor
    with client:
        yield client, key
    client.app.state.metering.close()  # type: ignore[attr-defined]


def complete(client: TestClient, key: str, prompt: list[int], max_tokens: int) -> dict:
    r = client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_cap_is_on_metrics_and_requests_are_served_whole(
    budgeted: tuple[TestClient, str],
) -> None:
    client, key = budgeted
    complete(client, key, list(range(5, 45)), 4)  # measures a prefill step and decodes
    outs: list[dict] = []
    # A long prompt arrives while another request decodes: it is prefilled by the floor.
    threads = [
        threading.Thread(target=lambda: outs.append(complete(client, key, [9] * 8, 40))),
        threading.Thread(target=lambda: outs.append(complete(client, key, [7] * 300, 3))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(o["usage"]["prompt_tokens"] for o in outs) == [8, 300]
    assert sorted(o["usage"]["completion_tokens"] for o in outs) == [3, 40]
    text = client.get("/metrics").text
    found = CAP_SERIES.search(text)
    assert found is not None, text[:2000]
    cap = float(found.group(1))
    assert cap.is_integer() and 16 <= cap <= 2048  # within the floor and the token budget


def test_without_a_budget_there_is_no_cap_series(tmp_path: Path) -> None:
    client, key = serve(tmp_path, itl_budget_ms="off")
    with client:
        complete(client, key, list(range(5, 45)), 2)
        assert "cloister_engine_prefill_token_cap{" not in client.get("/metrics").text
    client.app.state.metering.close()  # type: ignore[attr-defined]
