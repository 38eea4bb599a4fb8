"""KV-cache events from an engine server, as llm-d's indexer would receive them.

`cloister engine serve`'s app over the real engine (fake fast model), whose options
come from the settings as `cloister engine serve --kv-events-endpoint` makes them (in
either engine mode); a ZeroMQ SUB socket binds, as llm-d's indexer does, and the
engine connects to it. And the drop count on the gateway's /metrics, for a gateway
whose engine runs inside it (`cloister serve`).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest
import zmq

from engine.fronts.async_engine import AsyncEngine
from engine.kv_cache.kv_events import BlockStored, decode_batch
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tenancy.limiter.memory import MemoryLimiter
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.fast_fake_model import fast_fake_front, fast_fake_llm_engine, fast_fake_settings
from tests.utils.kv_replay import replay
from tests.utils.live_gateway import start_gateway
from tests.utils.services import free_port

TOKEN = "svc-" + "kv-events-token-for-tests"


@pytest.mark.parametrize("engine_mode", ["thread", "process"])
def test_a_completion_s_blocks_reach_a_subscriber_under_its_domain(
    tmp_path: Path, engine_mode: str
) -> None:
    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.bind(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    settings = fast_fake_settings(
        tmp_path,
        max_model_len=256,
        kv_events_endpoint=f"tcp://127.0.0.1:{port}",
        engine_mode=engine_mode,  # the process engine publishes from its child
    )
    front = fast_fake_front(settings)
    url, stop = serve_in_thread(
        EngineServer(front, model_name="fast-fake", auth=ServiceAuth(TOKEN)).app()
    )
    prompt = list(range(1000, 1040))  # two full blocks of 16
    stored: list[BlockStored] = []
    topics: set[bytes] = set()
    try:
        deadline = time.monotonic() + 20
        salt = 0
        # The first messages may go before the subscription reaches the engine (PUB
        # drops those): each round is a new domain, so each caches (and announces) anew.
        while not stored and time.monotonic() < deadline:
            salt += 1
            body = {
                "model": "fast-fake",
                "prompt": prompt,
                "max_tokens": 2,
                "cache_salt": f"domain-{salt}",
            }
            headers = {"authorization": f"Bearer {TOKEN}"}
            answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
            while sub.poll(300):
                topic, _seq, payload = sub.recv_multipart()
                topics.add(topic)
                batch = decode_batch(payload)
                stored += [e for e in batch.events if isinstance(e, BlockStored)]
        # An operator sees whether the publisher had to drop batches (none here).
        metrics = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text
    finally:
        stop()
        sub.close(linger=0)
    assert stored, "no BlockStored event arrived"
    last = stored[-1]
    assert last.cache_domain == f"domain-{salt}"
    assert last.token_ids == prompt[:32] and len(last.block_hashes) == 2
    assert topics == {f"kv@{socket.gethostname()}@fast-fake".encode()}
    assert 'cloister_kv_events_dropped_total{model_name="fast-fake"} 0.0' in metrics


def test_the_gateways_metrics_count_what_its_in_process_engine_dropped(tmp_path: Path) -> None:
    """`cloister serve` with an in-process engine that publishes: the gateway's /metrics
    carries the publisher's drop count, and keeps counting across scrapes."""
    engine = fast_fake_llm_engine(kv_events_endpoint=f"tcp://127.0.0.1:{free_port()}")
    publisher = engine.kv_events
    assert publisher is not None
    gw, stop = start_gateway(tmp_path, engine=AsyncEngine(engine), limiter=MemoryLimiter())
    series = 'cloister_kv_events_dropped_total{model_name="tiny"}'

    def complete(key: str) -> None:
        body = {"model": gw.model, "prompt": "hello there", "max_tokens": 2}
        headers = {"authorization": f"Bearer {key}"}
        answer = httpx.post(f"{gw.base_url}/v1/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text

    scraped: list[str] = []
    try:
        key = gw.tenant("acme")
        # As if bursts with no subscriber had overflowed its queue during the steps (the
        # counting itself: tests/engine/prefix_cache/test_kv_events.py); the engine
        # reports its stats with each step.
        for dropped in (0, 4, 9):
            publisher.dropped = dropped
            complete(key)
            scraped.append(httpx.get(f"{gw.base_url}/metrics", timeout=10).text)
    finally:
        stop()
        publisher.close()
    found = [
        f"{series} {n}" in text for text, n in zip(scraped, ("0.0", "4.0", "9.0"), strict=True)
    ]
    assert found == [True] * 3, [line for t in scraped for line in t.splitlines() if series in line]


def _replayed(endpoint: str, start: int) -> list[object]:
    """The events of the batches `endpoint` replays from `start` on."""
    return [
        e for _, p in replay(endpoint, start.to_bytes(8, "big")) for e in decode_batch(p).events
    ]


@pytest.mark.parametrize("engine_mode", ["thread", "process"])
def test_a_subscriber_that_joins_late_replays_what_it_missed(
    tmp_path: Path, engine_mode: str
) -> None:
    """`cloister engine serve --kv-events-replay-endpoint`: blocks cached before any
    subscriber existed are recovered from the replay socket, from sequence number 0."""
    from engine.kv_cache.kv_events import AllBlocksCleared

    replay_endpoint = f"ipc://{tmp_path}/kv-replay"
    settings = fast_fake_settings(
        tmp_path,
        max_model_len=256,
        kv_events_endpoint=f"ipc://{tmp_path}/kv",  # binds; nobody subscribes yet
        kv_events_replay_endpoint=replay_endpoint,
        engine_mode=engine_mode,
    )
    front = fast_fake_front(settings)
    url, stop = serve_in_thread(
        EngineServer(front, model_name="fast-fake", auth=ServiceAuth(TOKEN)).app()
    )
    prompt = list(range(2000, 2040))
    req = zmq.Context.instance().socket(zmq.REQ)
    try:
        body = {"model": "fast-fake", "prompt": prompt, "max_tokens": 2, "cache_salt": "late"}
        headers = {"authorization": f"Bearer {TOKEN}"}
        answer = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + 20
        while not (events := _replayed(replay_endpoint, 0)) or not any(
            isinstance(e, BlockStored) for e in events
        ):
            assert time.monotonic() < deadline, f"no BlockStored in the replay: {events}"
            time.sleep(0.05)
        # vLLM's example subscriber asks from a REQ socket, which takes one reply per
        # request: batch 0, the engine's announcement that it starts empty.
        req.connect(replay_endpoint)
        req.send((0).to_bytes(8, "big"))
        seq, payload = req.recv_multipart()
    finally:
        stop()
        req.close(linger=0)
    assert events[0] == AllBlocksCleared()
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert stored[-1].cache_domain == "late" and stored[-1].token_ids == prompt[:32]
    assert int.from_bytes(seq, "big") == 0 and decode_batch(payload).events == [AllBlocksCleared()]
