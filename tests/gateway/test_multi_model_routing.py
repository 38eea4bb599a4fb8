"""Several base models in one gateway (issue 14 §2), on real engines over the fake fast
model: each request goes to its own model's engine, tokenizer, context and vocabulary;
keys see only their models."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from engine.fronts.async_engine import AsyncEngine
from engine_hop.client import EngineSnapshot
from engine_hop.in_process import InProcessEngineClient
from gateway.app import create_app
from gateway.metrics import GatewayMetrics
from server.settings import Settings
from tenancy import store
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.byte_tokenizer import ByteTokenizer
from tests.utils.fast_fake_model import (
    GATEWAY_ENGINE_OPTIONS,
    fast_fake_llm_engine,
    gateway_test_engine,
)
from tests.utils.live_gateway import OPERATOR_HEADERS, ListUsageSink, operator_auth
from tests.utils.principals import PEPPER
from tests.utils.watched_engine import Watched


class DoubleByteTokenizer(ByteTokenizer):
    """Two tokens per byte: a model whose tokenizer counts differently from the other's."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Every byte twice."""
        return [t for b in super().encode(text, add_special_tokens) for t in (b, b)]


class Served:
    """A TestClient over one app serving "small" and "big", and the handles tests read."""

    def __init__(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 'cloister.db'}"
        upgrade_database(url)
        self.sessions = make_session_factory(make_engine(url))
        # The gateway tokenizes with the tokenizers set here (the engines answer in their
        # own), so that prompt counts are bytes: one token a byte on "small", two on "big".
        self.small = Watched(gateway_test_engine(max_model_len=64))
        self.small.tokenizer = ByteTokenizer()
        self.small.vocab_size = 200  # token ids 200..255 are outside this model's vocabulary
        self.big = Watched(gateway_test_engine(max_model_len=512))
        self.big.tokenizer = DoubleByteTokenizer()
        self.usage = ListUsageSink()
        self.app = create_app(
            Settings(data_dir=tmp_path, key_pepper=PEPPER, config_refresh_s=0.0),
            engines={
                "small": InProcessEngineClient(self.small, model_name="small"),
                "big": InProcessEngineClient(self.big, model_name="big"),
            },
            authenticator=Authenticator(self.sessions, PEPPER, refresh_s=0.0),
            limiter=MemoryLimiter(),
            usage_sink=self.usage,
            operator_auth=operator_auth,
        )
        with self.sessions() as s:
            store.create_tenant(s, name="acme")
        self.key = self.new_key()

    def new_key(self, **kwargs: Any) -> str:
        """A new key of acme."""
        with self.sessions() as s:
            return store.create_key(s, tenant_name="acme", pepper=PEPPER, **kwargs).secret

    def post(
        self, client: TestClient, path: str, body: dict[str, Any], key: str | None = None
    ) -> httpx.Response:
        """POST with the key as bearer."""
        return client.post(path, json=body, headers={"Authorization": f"Bearer {key or self.key}"})


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, TestClient]]:
    s = Served(tmp_path)
    with TestClient(s.app) as client:
        yield s, client


def test_requests_go_to_their_models_engine(served: tuple[Served, TestClient]) -> None:
    s, client = served
    for model, engine in (("small", s.small), ("big", s.big)):
        r = s.post(client, "/v1/completions", {"model": model, "prompt": "hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == model
        assert len(engine.domains) == 1  # this engine got it ...
    assert [u.model for u in s.usage.records] == ["small", "big"]
    # ... and the model's own tokenizer counted it: "hello" is 5 tokens, or 10 on "big".
    assert [u.prompt_tokens for u in s.usage.records] == [5, 10]


def test_context_and_vocabulary_are_the_requests_models(
    served: tuple[Served, TestClient],
) -> None:
    s, client = served
    long = "x" * 100  # over small's context of 64, well inside big's 512
    r = s.post(client, "/v1/completions", {"model": "small", "prompt": long, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = s.post(client, "/v1/completions", {"model": "big", "prompt": long, "max_tokens": 1})
    assert r.status_code == 200, r.text
    ids = {"prompt": [250, 251], "max_tokens": 1}  # outside small's vocabulary of 200
    r = s.post(client, "/v1/completions", {"model": "small", **ids})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert s.post(client, "/v1/completions", {"model": "big", **ids}).status_code == 200
    # max_tokens is checked against the model's own context: 100 does not fit small's 64.
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100}
    assert s.post(client, "/v1/chat/completions", {"model": "small", **chat}).status_code == 400
    assert s.post(client, "/v1/chat/completions", {"model": "big", **chat}).status_code == 200
    assert len(s.small.domains) == 0 and len(s.big.domains) == 3


def test_unknown_model_is_404_and_keys_see_only_their_models(
    served: tuple[Served, TestClient],
) -> None:
    s, client = served
    r = s.post(
        client,
        "/v1/chat/completions",
        {"model": "nope", "messages": [{"role": "user", "content": "x"}]},
    )
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    listed = client.get("/v1/models", headers={"Authorization": f"Bearer {s.key}"}).json()
    assert [m["id"] for m in listed["data"]] == ["small", "big"]
    only_big = s.new_key(allowed_models=["big"])
    headers = {"Authorization": f"Bearer {only_big}"}
    assert [m["id"] for m in client.get("/v1/models", headers=headers).json()["data"]] == ["big"]
    assert client.get("/v1/models/big", headers=headers).status_code == 200
    assert client.get("/v1/models/small", headers=headers).status_code == 404
    r = s.post(client, "/v1/completions", {"model": "small", "prompt": "x"}, key=only_big)
    assert r.status_code == 403
    assert (
        s.post(
            client,
            "/v1/completions",
            {"model": "big", "prompt": "x", "max_tokens": 2},
            key=only_big,
        ).status_code
        == 200
    )
    assert s.small.domains == []


def test_metrics_carry_each_models_engine_series(served: tuple[Served, TestClient]) -> None:
    s, client = served
    prompt = {"prompt": "a prefix of more than two fake blocks.", "max_tokens": 2}  # 38 < 64
    for _ in range(2):
        assert s.post(client, "/v1/completions", {"model": "small", **prompt}).status_code == 200
    text = client.get("/metrics", headers=OPERATOR_HEADERS).text  # prefix series: operators'
    for model in ("small", "big"):
        assert f'vllm:num_requests_running{{model_name="{model}"}}' in text
        assert f'vllm:prefix_cache_queries_total{{model_name="{model}"}}' in text
    assert 'vllm:e2e_request_latency_seconds_count{model_name="small"} 2.0' in text
    hits = {
        m: float(line.rsplit(" ", 1)[1])
        for m in ("small", "big")
        for line in text.splitlines()
        if line.startswith(f'vllm:prefix_cache_hits_total{{model_name="{m}"}}')
    }
    assert hits["small"] > 0 and hits["big"] == 0  # the second prompt hit small's own cache


def test_one_dead_engine_fails_health(served: tuple[Served, TestClient]) -> None:
    s, client = served
    assert client.get("/health").status_code == 200
    assert client.portal is not None
    client.portal.call(s.big.shutdown)  # the engine stops: it is no longer alive
    assert client.get("/health").status_code == 503


def test_create_app_takes_one_engine_or_a_map(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, key_pepper=PEPPER)
    common: dict[str, Any] = {
        "authenticator": Authenticator(make_session_factory(make_engine("sqlite://")), PEPPER),
        "limiter": MemoryLimiter(),
    }
    one = InProcessEngineClient(gateway_test_engine(), model_name="m")
    with pytest.raises(ValueError, match="exactly one"):
        create_app(settings, engine_client=one, engines={"m": one}, **common)
    with pytest.raises(ValueError, match="exactly one"):
        create_app(settings, **common)
    with pytest.raises(ValueError, match="at least one"):
        create_app(settings, engines={}, **common)
    app = create_app(settings, engine_client=one, **common)
    assert app.state.cloister.served_models == ("m",)


def test_engine_counters_are_kept_per_model() -> None:
    metrics = GatewayMetrics(model_name="a", top_tenants=2)
    metrics.render(
        {"a": EngineSnapshot(0, 0, 0.1, 100, 40, 0), "b": EngineSnapshot(0, 0, 0.2, 10, 5, 0)}
    )
    text = metrics.render(
        {"a": EngineSnapshot(0, 0, 0.1, 150, 60, 0), "b": EngineSnapshot(0, 0, 0.2, 12, 6, 0)},
        include_tenants=True,  # the prefix-cache series are operators'
    ).decode()
    assert 'vllm:prefix_cache_hits_total{model_name="a"} 60.0' in text
    assert 'vllm:prefix_cache_hits_total{model_name="b"} 6.0' in text
    assert 'vllm:kv_cache_usage_perc{model_name="b"} 0.2' in text


class RecordingEngine(AsyncEngine):
    """The real front over the fake fast model, which notes its start and stop, and can
    fail either."""

    def __init__(self, log: list[str], name: str, *, fail: str = "") -> None:
        super().__init__(fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS))
        self.log, self.name, self.fail = log, name, fail

    async def start(self) -> None:
        """Notes the start; raises when told to fail it."""
        if self.fail == "start":
            raise RuntimeError(f"{self.name} cannot start")
        await super().start()
        self.log.append(f"start {self.name}")

    async def shutdown(self) -> None:
        """Notes the stop; raises when told to fail it."""
        self.log.append(f"stop {self.name}")
        await super().shutdown()
        if self.fail == "stop":
            raise RuntimeError(f"{self.name} cannot stop")


@pytest.mark.parametrize("fail", ["start", "stop"])
def test_the_lifespan_starts_and_stops_every_engine(fail: str, tmp_path: Path) -> None:
    log: list[str] = []
    engines = {
        "a": RecordingEngine(log, "a", fail="stop" if fail == "stop" else ""),
        "b": RecordingEngine(log, "b", fail="start" if fail == "start" else ""),
        "c": RecordingEngine(log, "c"),
    }
    app = create_app(
        Settings(data_dir=tmp_path, key_pepper=PEPPER),
        engines={n: InProcessEngineClient(e, model_name=n) for n, e in engines.items()},
        authenticator=Authenticator(make_session_factory(make_engine("sqlite://")), PEPPER),
        limiter=MemoryLimiter(),
    )
    if fail == "start":  # b fails: a, started, is stopped again; c never starts
        with pytest.raises(RuntimeError, match="b cannot start"), TestClient(app):
            pass
        assert log == ["start a", "stop a"]
    else:  # a fails to stop: the others are stopped all the same
        with TestClient(app):
            assert log == ["start a", "start b", "start c"]
        assert sorted(log[3:]) == ["stop a", "stop b", "stop c"]
