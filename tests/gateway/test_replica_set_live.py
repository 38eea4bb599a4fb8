"""`cloister serve --engine-urls` over two `cloister engine serve` processes (tiny model).

The router keeps each tenant's prefix on one replica (so its cache hits), never lets
one tenant's requests find another's, survives a replica killed mid-stream (clean
errors, one usage record per request, new requests elsewhere at once) and takes the
replica back when it returns.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from admin.identity import create_admin_token
from tests.gateway import processes
from tests.gateway.engine_servers import (
    SERVICE_TOKEN,
    EngineProcess,
    engine_servers,
    spawn_engine,
    wait_ready,
)
from tests.utils.principals import PEPPER
from tests.utils.services import free_port
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow
AUTH = {"authorization": f"Bearer {SERVICE_TOKEN}"}
PROMPT = [{"role": "user", "content": "A long shared system prompt about caches. " * 4}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def engines(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[EngineProcess]]:
    with engine_servers(model_dir, tmp_path_factory.mktemp("engine-logs"), 2) as started:
        yield started


@pytest.fixture(scope="module")
def fleet(
    engines: list[EngineProcess], model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[processes.GatewayProcess, Path]]:
    data_dir = tmp_path_factory.mktemp("data")
    processes.database(data_dir)
    urls = ",".join(e.base_url for e in engines)
    with processes.gateways(
        data_dir,
        model_dir,
        tmp_path_factory.mktemp("gw-logs"),
        [{"engine_urls": urls, "service_token": SERVICE_TOKEN}],
    ) as (gateway,):
        yield gateway, data_dir


def _key(data_dir: Path, name: str) -> str:
    return processes.create_tenant_key(processes.database(data_dir), name)


def _chat(base_url: str, key: str, **extra: object) -> dict[str, object]:
    body = {"model": "tiny", "messages": PROMPT, "max_tokens": 4, "temperature": 0, **extra}
    response = httpx.post(
        base_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def _cached(result: dict[str, object]) -> int:
    usage = result["usage"]
    assert isinstance(usage, dict)
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def _queries(engine: EngineProcess) -> int:
    stats = httpx.get(engine.base_url + "/internal/stats", headers=AUTH, timeout=10).json()
    return int(stats["prefix_cache_queries"])


def test_each_tenant_sticks_to_one_replica_and_finds_only_its_own_cache(
    fleet: tuple[processes.GatewayProcess, Path], engines: list[EngineProcess]
) -> None:
    gateway, data_dir = fleet
    before = [_queries(e) for e in engines]
    for i in range(10):
        key = _key(data_dir, f"sticky-{i}")
        first = _chat(gateway.base_url, key)
        assert _cached(first) == 0  # the same prompt, cached by earlier tenants: not theirs
        assert all(_cached(_chat(gateway.base_url, key)) > 0 for _ in range(2))
    # Ten tenants over two replicas: both served some (all on one: 2 in 1024).
    assert all(_queries(e) > b for e, b in zip(engines, before, strict=True))


def test_the_replica_polls_do_not_flood_the_gateway_log(
    fleet: tuple[processes.GatewayProcess, Path],
) -> None:
    """The replica set polls each engine's stats every second; at INFO, httpx's own line
    for each poll made up most of an operator's log (two replicas: 120 lines a minute)."""
    gateway, data_dir = fleet
    _chat(gateway.base_url, _key(data_dir, "log-reader"))
    time.sleep(2.5)  # at least two polls of each replica
    records = [json.loads(line) for line in gateway.logs().splitlines() if line.startswith("{")]
    assert any(r["logger"] == "cloister.access" for r in records)  # INFO lines still come
    chatty = [r["message"] for r in records if r["logger"] in ("httpx", "httpcore")]
    assert chatty == []


def test_a_gateway_starts_and_serves_with_one_of_its_engines_down(
    engines: list[EngineProcess], model_dir: Path, tmp_path: Path
) -> None:
    """`--engine-urls DOWN,UP`: the gateway starts on the replica that answers (it used
    to wait out its whole connect wait on the first URL, then fail), and the one that is
    down leaves the set (a request sent there before a poll finds out goes elsewhere)."""
    data_dir = tmp_path / "data"
    processes.database(data_dir)
    down = f"http://127.0.0.1:{free_port()}"
    urls = f"{down},{engines[0].base_url}"
    config = {"engine_urls": urls, "service_token": SERVICE_TOKEN}
    with processes.gateways(data_dir, model_dir, tmp_path / "logs", [config]) as (gateway,):
        key = _key(data_dir, "one-down")
        left = f"engine replica {down} left the set"
        deadline = time.monotonic() + 15  # three failed polls, a second apart
        while left not in gateway.logs() and time.monotonic() < deadline:
            assert _chat(gateway.base_url, key)["choices"]  # routing notices who left
        logs = gateway.logs()
    assert "waiting up to" not in logs  # one engine answered at once
    assert left in logs


def _stream(base_url: str, key: str, out: list[str]) -> None:
    body = {
        "model": "tiny",
        "messages": PROMPT,
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        base_url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=120,
    ) as response:
        out.extend(line for line in response.iter_lines() if line.startswith("data:"))


def _replica_series(
    gateway: processes.GatewayProcess, token: str, name: str = "cloister_engine_replica_up"
) -> dict[str, float]:
    """One cloister_engine_replica_* series per replica, from the gateway's /metrics as an
    operator."""
    auth = {"authorization": f"Bearer {token}"}
    text = httpx.get(gateway.base_url + "/metrics", headers=auth, timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == name]
    return {s.labels["replica"]: s.value for s in family.samples}


def _usage_statuses(data_dir: Path, request_ids: list[str]) -> dict[str, list[int]]:
    sessions = processes.database(data_dir)
    with sessions() as s:
        rows = s.execute(text("SELECT request_id, status FROM usage_records")).all()
    found: dict[str, list[int]] = {r: [] for r in request_ids}
    for request_id, status in rows:
        if request_id in found:
            found[request_id].append(int(status))
    return found


def test_a_replica_killed_mid_stream(
    fleet: tuple[processes.GatewayProcess, Path],
    engines: list[EngineProcess],
    model_dir: Path,
    tmp_path: Path,
) -> None:
    gateway, data_dir = fleet
    with processes.database(data_dir)() as s:
        viewer = create_admin_token(s, pepper=PEPPER, role="viewer").secret
    # Operators see each replica in service; an anonymous scrape sees no internal address.
    assert _replica_series(gateway, viewer) == {e.base_url: 1.0 for e in engines}
    assert "cloister_engine_replica" not in httpx.get(gateway.base_url + "/metrics").text
    keys = [_key(data_dir, f"streamer-{i}") for i in range(10)]
    outputs: list[list[str]] = [[] for _ in keys]
    readers = [
        threading.Thread(target=_stream, args=(gateway.base_url, k, out))
        for k, out in zip(keys, outputs, strict=True)
    ]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 60
    while any(len(o) < 5 for o in outputs) and time.monotonic() < deadline:
        time.sleep(0.02)
    in_flight = _replica_series(gateway, viewer, "cloister_engine_replica_in_flight")
    assert sum(in_flight.values()) == len(keys) and set(in_flight) == {e.base_url for e in engines}
    victim = engines[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=10)
    killed_at = time.monotonic()
    # New requests go elsewhere at once: a refused connection is retried before any token.
    fresh = _key(data_dir, "after-the-kill")
    for _ in range(4):
        _chat(gateway.base_url, fresh)
    assert time.monotonic() - killed_at < 5.0
    for reader in readers:
        reader.join(timeout=120)
    broken = [o for o in outputs if any('"error"' in line for line in o)]
    whole = [o for o in outputs if any('"finish_reason":"' in line for line in o)]
    assert broken, "no stream was on the killed replica (1 in 1024): rerun"
    assert len(broken) + len(whole) == len(outputs)  # every stream ended one way or the other
    assert all(o[-1] == "data: [DONE]" for o in whole)
    ids = [json.loads(o[0].removeprefix("data: "))["id"] for o in outputs]
    deadline = time.monotonic() + 15
    while True:  # usage reaches the database through the metering writer
        statuses = _usage_statuses(data_dir, ids)
        if all(len(v) == 1 for v in statuses.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(len(v) == 1 for v in statuses.values()), statuses  # exactly once each
    assert sorted(v[0] for v in statuses.values()).count(200) == len(whole)
    deadline = time.monotonic() + 10  # three failed polls, a second apart
    while _replica_series(gateway, viewer)[victim.base_url] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _replica_series(gateway, viewer) == {victim.base_url: 0.0, engines[1].base_url: 1.0}
    # It comes back on the same port and rejoins the set.
    engines[0] = revived = spawn_engine(model_dir, tmp_path / "revived.log", port=victim.port)
    wait_ready(revived)
    deadline = time.monotonic() + 10
    while "rejoined" not in gateway.logs() and time.monotonic() < deadline:
        _chat(gateway.base_url, fresh)
        time.sleep(0.2)
    assert f"engine replica {revived.base_url} rejoined" in gateway.logs()
    assert _replica_series(gateway, viewer) == {e.base_url: 1.0 for e in engines}
