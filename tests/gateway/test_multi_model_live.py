"""Two base models in one `cloister serve` (issue 14 §2), live over HTTP with the openai SDK.

The app is the real `assembly.app.build_app` over two tiny random-weight models (different
seeds, so their greedy answers differ), served by uvicorn: requests route by `model`, each
model has its own prefix cache, /metrics labels each engine's series by model, usage
names the model, and the registry lists both as loaded.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from assembly.app import build_app
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.built_app import admin_secret, migrated_sessions, tenant_keys
from tests.utils.principals import PEPPER
from tests.utils.served_app import served_app, served_models_settings
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

# More than two KV blocks of 16 tokens, so a repeat finds whole blocks in the cache.
PROMPT = "Tell me about the mountains near the lake, the river and the old town. " * 3


@dataclass
class Served:
    """The running server: its URL, an API key, an admin token and the app."""

    base_url: str
    key: str
    admin: str
    app: Any

    def client(self) -> OpenAI:
        """An openai SDK client with the tenant's key."""
        return OpenAI(base_url=self.base_url + "/v1", api_key=self.key, max_retries=0, timeout=120)

    def get(self, path: str, **params: Any) -> httpx.Response:
        """GET with the admin token (the admin API, the operator's /metrics)."""
        return httpx.get(
            self.base_url + path,
            params=params,
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=60,
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("multi")
    alpha = make_tiny_model_dir(tmp / "models", seed=1)
    beta = make_tiny_model_dir(tmp / "models", seed=2)
    settings = served_models_settings(tmp, [f"alpha={alpha}", f"beta={beta}"])
    sessions = migrated_sessions(settings)
    key = tenant_keys(sessions, ("acme",))["acme"]
    admin = admin_secret(sessions)
    with served_app(settings, start_timeout_s=120, stop_timeout_s=60) as (url, app):
        yield Served(url, key, admin, app)


def _answer(served: Served, model: str, prompt: str = "Hello there") -> tuple[str, int]:
    """The greedy completion's text and its cached prompt tokens."""
    done = served.client().completions.create(
        model=model, prompt=prompt, max_tokens=8, temperature=0
    )
    assert done.model == model
    assert done.usage is not None
    details = done.usage.prompt_tokens_details
    return done.choices[0].text, (details.cached_tokens or 0) if details else 0


def _sample(text: str, name: str, model: str) -> float:
    """The value of the series `name`{model_name="model"} in an exposition text."""
    head = f'{name}{{model_name="{model}"}} '
    values = [float(line[len(head) :]) for line in text.splitlines() if line.startswith(head)]
    assert len(values) == 1, (name, model)
    return values[0]


def test_both_models_are_listed_and_retrievable(served: Served) -> None:
    client = served.client()
    assert [m.id for m in client.models.list().data] == ["alpha", "beta"]
    for name in ("alpha", "beta"):
        assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gamma")
    assert caught.value.code == "model_not_found"


def test_requests_route_by_model(served: Served) -> None:
    alpha, _ = _answer(served, "alpha")
    beta, _ = _answer(served, "beta")
    assert alpha != beta  # two different weight sets answered
    assert _answer(served, "alpha")[0] == alpha  # and each answers the same again
    chat = served.client().chat.completions.create(
        model="beta", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert chat.model == "beta" and chat.usage is not None and chat.usage.completion_tokens > 0
    with pytest.raises(openai.NotFoundError) as caught:
        served.client().completions.create(model="gamma", prompt="x", max_tokens=2)
    assert caught.value.code == "model_not_found" and caught.value.status_code == 404


def test_each_model_has_its_own_cache(served: Served) -> None:
    before = served.get("/metrics").text
    hits_before = {m: _sample(before, "vllm:prefix_cache_hits_total", m) for m in ("alpha", "beta")}
    assert _answer(served, "alpha", PROMPT)[1] == 0  # nothing cached yet
    assert _answer(served, "alpha", PROMPT)[1] >= 32  # alpha's own cache: a hit
    assert _answer(served, "beta", PROMPT)[1] == 0  # beta's cache never saw it
    assert _answer(served, "beta", PROMPT)[1] >= 32
    after = served.get("/metrics").text
    for model in ("alpha", "beta"):
        assert _sample(after, "vllm:prefix_cache_hits_total", model) >= hits_before[model] + 32
        assert _sample(after, "vllm:prefix_cache_queries_total", model) > 0
        assert _sample(after, "vllm:num_requests_running", model) == 0
        assert _sample(after, "vllm:e2e_request_latency_seconds_count", model) >= 2


def test_metrics_usage_and_registry_name_each_model(served: Served) -> None:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    _answer(served, "alpha")
    _answer(served, "beta")
    anonymous = httpx.get(served.base_url + "/metrics", timeout=30).text
    assert 'model_name="alpha"' in anonymous and 'model_name="beta"' in anonymous
    operator = served.get("/metrics").text
    for model in ("alpha", "beta"):
        assert f'cloister_requests_total{{model="{model}",status="200",tenant="acme"}}' in operator

    assert served.app.state.metering.flush()
    end = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    for model in ("alpha", "beta"):
        usage = served.get(
            "/admin/api/v1/usage", start=start.isoformat(), end=end.isoformat(), model=model
        )
        assert usage.status_code == 200, usage.text
        rows = usage.json()["items"]
        assert rows and all(r["model"] == model for r in rows), rows
        assert sum(r["requests"] for r in rows) >= 1

    models = served.get("/admin/api/v1/models")
    assert models.status_code == 200, models.text
    loaded = {m["name"]: m for m in models.json()["items"]}
    assert loaded["alpha"]["status"] == loaded["beta"]["status"] == "loaded"
    assert loaded["alpha"]["revision"] != loaded["beta"]["revision"]  # different weights
    assert loaded["alpha"]["context_length"] == loaded["beta"]["context_length"] == 256


def test_two_models_each_in_a_child_process(tmp_path: Path) -> None:
    """engine_mode "process": one child process per model, each answering its own model."""
    from engine.fronts.process_engine import ProcessEngine

    settings = Settings(
        data_dir=tmp_path,
        key_pepper=PEPPER,
        models=[
            f"alpha={make_tiny_model_dir(tmp_path / 'm', seed=1)}",
            f"beta={make_tiny_model_dir(tmp_path / 'm', seed=2)}",
        ],
        engine_mode="process",
        attention_backend="torch",
        max_model_len=256,
        kv_cache_bytes=8 * 1024 * 1024,
        log_level="WARNING",
    )
    upgrade_database(settings.resolved_database_url)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    with sessions() as s:
        store.create_tenant(s, name="acme")
        key = store.create_key(s, tenant_name="acme", pepper=PEPPER).secret
    app = build_app(settings)
    engines = app.state.cloister.engines
    pids = {name: client._engine.pid for name, client in engines.items()}
    assert all(isinstance(c._engine, ProcessEngine) for c in engines.values())
    assert len(set(pids.values())) == 2 and None not in pids.values()
    texts = {}
    with TestClient(app) as http:
        for model in ("alpha", "beta"):
            r = http.post(
                "/v1/completions",
                json={"model": model, "prompt": "Hello there", "max_tokens": 8, "temperature": 0},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 200, r.text
            texts[model] = r.json()["choices"][0]["text"]
    app.state.metering.close()
    for writer in app.state.background_writers:
        writer.close()
    assert texts["alpha"] != texts["beta"]
