"""`kill -9` a live `cloister serve` under load, restart it on the same data directory, and
check that tenants, keys, usage, budgets and the audit chain all survived.

Set-up is done the ways an operator does it: tenants, keys, a budget and the admin token
with the CLI, one more tenant and key through the admin API. Three tenants then make
requests on threads while a fourth exhausts its daily token budget; the server is killed
in the middle of that traffic.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from cloister.cli import main as cli
from tests.gateway.processes import GatewayProcess, database, spawn_gateway, stop, wait_ready
from tests.reliability.live import ADMIN, usage_rows, wait_for_usage
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

BUSY_TENANTS = ("alpha", "beta", "gamma")
COMPLETED_BEFORE_KILL = 24  # the kill comes once this many replies reached their clients
BUDGET_TOKENS = 40
CLIENTS_PER_TENANT = 3


def run_cli(data_dir: Path, *args: str) -> Any:
    """Runs `cloister ARGS --json` on the data directory; returns the parsed output."""
    env = {"CLOISTER_DATA_DIR": str(data_dir), "CLOISTER_KEY_PEPPER": PEPPER}
    out = CliRunner().invoke(cli, [*args, "--json"], env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return json.loads(out.output)


def chat(client: httpx.Client, key: str, content: str) -> httpx.Response:
    """A small non-streaming chat completion, read to the end."""
    return client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 6,
            "temperature": 0,
        },
        headers={"Authorization": f"Bearer {key}"},
    )


class Load:
    """Tenants' clients making requests on threads until the server goes away."""

    def __init__(self, base_url: str, keys: dict[str, str]) -> None:
        self.base_url = base_url
        self.keys = keys
        self.completed: dict[str, dict[str, Any]] = {}  # request id -> usage it reported
        self.lock = threading.Lock()
        self.enough = threading.Event()  # set the moment COMPLETED_BEFORE_KILL replies are in
        # Several clients per tenant, so that replies complete all the time, also in the
        # instant of the kill.
        self.threads = [
            threading.Thread(target=self._loop, args=(name,), daemon=True)
            for name in keys
            for _ in range(CLIENTS_PER_TENANT)
        ]

    def start(self) -> None:
        """Starts the clients' threads."""
        for t in self.threads:
            t.start()

    def _loop(self, name: str) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            for i in range(10_000):
                try:
                    r = chat(client, self.keys[name], f"{name} request {i}")
                except httpx.HTTPError:
                    return  # the server was killed
                if r.status_code == 200:
                    body = r.json()
                    with self.lock:
                        self.completed[body["id"]] = body["usage"]
                        if len(self.completed) >= COMPLETED_BEFORE_KILL:
                            self.enough.set()

    def join(self) -> None:
        """Waits for every thread to notice the server is gone."""
        for t in self.threads:
            t.join(timeout=60)


def admin(gw: GatewayProcess, token: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One admin API call with `token`."""
    return httpx.request(
        method,
        gw.base_url + ADMIN + path,
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        **kwargs,
    )


def exhausted(gw: GatewayProcess, key: str) -> list[int]:
    """Three attempts of the tenant whose budget is spent: the statuses it got."""
    with httpx.Client(base_url=gw.base_url, timeout=60) as client:
        replies = [chat(client, key, "one more") for _ in range(3)]
    for r in replies:
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota", r.text
    return [r.status_code for r in replies]


@pytest.mark.slow
def test_kill_9_under_load_then_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    database(data_dir)
    model = make_tiny_model_dir(tmp_path, tie=False)
    for name in ("alpha", "beta", "broke"):
        run_cli(data_dir, "tenants", "create", name)
    keys = {
        name: run_cli(data_dir, "keys", "create", "--tenant", name)["key"]
        for name in ("alpha", "beta", "broke")
    }
    run_cli(
        data_dir,
        "tenants",
        "set-limits",
        "broke",
        "--budget",
        str(BUDGET_TOKENS),
        "--budget-period",
        "day",
    )
    token = run_cli(data_dir, "admin", "create-token", "--role", "admin")["token"]

    first = spawn_gateway(data_dir, model, tmp_path / "first.log")
    try:
        wait_ready(first)
        assert admin(first, token, "POST", "/tenants", json={"name": "gamma"}).status_code == 201
        created = admin(first, token, "POST", "/tenants/gamma/keys", json={})
        assert created.status_code == 201, created.text
        keys["gamma"] = created.json()["secret"]
        time.sleep(1.0)  # the gateway's tenant/key cache refreshes every 0.5 s

        # Spend the budget: requests until the first refusal.
        with httpx.Client(base_url=first.base_url, timeout=60) as client:
            spent = [chat(client, keys["broke"], "spend").status_code for _ in range(20)]
            if 429 not in spent:
                pytest.fail(f"the budget of {BUDGET_TOKENS} tokens was never exhausted: {spent}")
        assert exhausted(first, keys["broke"]) == [429, 429, 429]

        load = Load(first.base_url, {name: keys[name] for name in BUSY_TENANTS})
        load.start()
        # Killed right as a reply completes: its usage is then in flight, the case to test.
        load.enough.wait(timeout=120)
        first.proc.kill()  # SIGKILL: no shutdown, no flush
        first.proc.wait(timeout=30)
        load.join()
    finally:
        stop(first)
    completed = dict(load.completed)
    assert len(completed) >= COMPLETED_BEFORE_KILL

    second = spawn_gateway(data_dir, model, tmp_path / "second.log")
    try:
        wait_ready(second)
        # Tenants and keys (CLI- and API-made alike) survived; the same secrets authenticate.
        listed = admin(second, token, "GET", "/tenants", params={"limit": 100})
        assert listed.status_code == 200, listed.text
        names = {t["name"] for t in listed.json()["items"]}
        assert {"alpha", "beta", "gamma", "broke"} <= names
        with httpx.Client(base_url=second.base_url, timeout=60) as client:
            for name in BUSY_TENANTS:
                assert chat(client, keys[name], "after the crash").status_code == 200, name

        # Every survival check runs, and all that failed are reported together.
        harm: list[str] = []
        # Usage: every reply that reached its client before the kill has its record.
        wait_for_usage(data_dir / "cloister.db", set(completed))
        rows = {r["request_id"]: r for r in usage_rows(data_dir / "cloister.db")}
        lost = sorted(set(completed) - set(rows))
        if lost:
            harm.append(f"{len(lost)} of {len(completed)} completed requests lost their usage")
        harm += [
            f"{request_id}: stored {rows[request_id]}, the client got {usage}"
            for request_id, usage in completed.items()
            if request_id in rows
            and (rows[request_id]["prompt_tokens"], rows[request_id]["completion_tokens"])
            != (usage["prompt_tokens"], usage["completion_tokens"])
        ]
        # The exhausted budget is still exhausted.
        after = exhausted(second, keys["broke"])
        if after != [429, 429, 429]:
            harm.append(f"the exhausted budget answered {after} after the restart")
        # The audit log kept the admin API's changes.
        events = admin(second, token, "GET", "/audit", params={"limit": 500})
        assert events.status_code == 200, events.text
        actions = {e["action"] for e in events.json()["items"]}
        if not {"tenant.create", "key.create"} <= actions:
            harm.append(f"the admin API's changes are not in the audit log: {sorted(actions)}")
    finally:
        stop(second)
    env = {"CLOISTER_DATA_DIR": str(data_dir), "CLOISTER_KEY_PEPPER": PEPPER}
    verified = CliRunner().invoke(cli, ["audit", "verify"], env=env, catch_exceptions=False)
    if verified.exit_code != 0:
        harm.append(f"cloister audit verify failed: {verified.output}")
    assert harm == [], "\n".join(harm)
