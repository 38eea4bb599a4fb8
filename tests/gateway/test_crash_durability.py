"""`kill -9` a live `cloister serve` right after its responses, then restart it: every request
whose response reached the client completely has a usage record (issue 13, defect 11), and
an exhausted token budget is still exhausted (defect 10: the in-memory limiter starts cold
and seeds its budget counters from the usage ledger)."""

from __future__ import annotations

import json
import os
import signal
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from admin.models import UsageRow
from tests.gateway.processes import GatewayProcess, create_tenant_key, database, running_gateway
from tests.gateway.test_budget_restart import BUDGET, exhaust, still_refused
from tests.utils.tiny_model import make_tiny_model_dir

N = 40


def _complete(gw: GatewayProcess, key: str, i: int) -> str | None:
    """One request read to its end; its id, or None when it did not complete."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"hello {i}"}],
        "max_tokens": 4,
        "stream": i % 2 == 1,
    }
    headers = {"Authorization": f"Bearer {key}"}
    url = gw.base_url + "/v1/chat/completions"
    if not body["stream"]:
        r = httpx.post(url, json=body, headers=headers, timeout=60)
        return str(r.json()["id"]) if r.status_code == 200 else None
    request_id = None
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                return request_id
            if line.startswith("data: "):
                request_id = json.loads(line[6:]).get("id", request_id)
    return None  # the stream ended without [DONE]: not complete


@pytest.mark.slow
def test_usage_and_budgets_survive_kill_9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sessions = database(data)
    key = create_tenant_key(sessions, "acme")
    capped = create_tenant_key(sessions, "capped", token_budget=BUDGET, budget_period="day")
    model = make_tiny_model_dir(tmp_path)
    with running_gateway(data, model, tmp_path / "first.log") as gw:
        exhaust(gw, capped)
        with ThreadPoolExecutor(max_workers=8) as pool:
            ids = [i for i in pool.map(lambda i: _complete(gw, key, i), range(N)) if i]
        os.kill(gw.proc.pid, signal.SIGKILL)  # at once: no shutdown hook runs
        gw.proc.wait(timeout=30)
    assert len(ids) == N
    # Ready to serve means the restart has replayed the spool: it does that first.
    with running_gateway(data, model, tmp_path / "second.log") as again:
        with sessions() as s:
            recorded = set(s.scalars(sa.select(UsageRow.request_id)))
        still_refused(again, capped)
    missing = sorted(set(ids) - recorded)
    assert not missing, f"{len(missing)} of {len(ids)} completed requests lost: {missing[:5]}"
    spool = data / "usage-spool.jsonl"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o600  # also after the replay rewrote it
