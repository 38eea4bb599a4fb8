"""LoRA adapters end to end on the real engine over the fake fast model (issue 15): uploaded through the admin API,
loaded by the registry sync without a restart, selected as "base:adapter" with the
openai SDK, kept to their owners, counted in usage and metrics, unloaded when retired.

Runs the real `cloister serve` wiring (`build_app`) in-process; one app for the module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.identity import create_admin_token
from admin.models import AuditEvent, LoraAdapter, UsageRow
from assembly.app import build_app
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.admin.zip_archives import HEADS, HIDDEN, INTERMEDIATE, KV_HEADS, adapter_files, zip_of
from tests.utils.adapter_engine import ARCHIVE_SHAPE, AdapterTestEngine, adapter_test_engine
from tests.utils.principals import PEPPER

LOAD_WITHIN_S = 5.0  # the bound: registered -> servable without a restart


@dataclass
class Live:
    """The app, its engine, the database and the credentials the tests use."""

    client: TestClient
    engine: AdapterTestEngine
    sessions: sessionmaker[Session]
    admin: dict[str, str]
    key_a: str
    key_b: str
    tenant_a: str
    key_narrow: str  # its tenant's model list names only "fake:shared"

    def chat(self, key: str, model: str) -> Any:
        """A raw chat request (for status codes and error bodies)."""
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        return self.client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )

    def sdk(self, key: str) -> openai.OpenAI:
        """The openai SDK over the in-process app."""
        return openai.OpenAI(
            base_url="http://testserver/v1", api_key=key, http_client=self.client, max_retries=0
        )

    def upload(self, name: str, owner: str | None) -> Any:
        """Uploads a PEFT zip for the base model "fake"."""
        config = {"r": 4, "lora_alpha": 8, "peft_type": "LORA", "base_model_name_or_path": "fake"}
        params = {"name": name, "base_model": "fake"}
        if owner is not None:
            params["owner_tenant"] = owner
        return self.client.post(
            "/admin/api/v1/adapters/upload",
            params=params,
            content=zip_of(adapter_files(config)),
            headers=self.admin,
        )


def wait_for(check: Callable[[], bool], timeout_s: float = LOAD_WITHIN_S) -> float:
    """Seconds until `check()` held; fails after `timeout_s`."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("adapters")
    settings = Settings(data_dir=tmp, key_pepper=PEPPER, model_name="fake", config_refresh_s=0.2)
    upgrade_database(settings.resolved_database_url)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    base = tmp / "models" / "fake-hf"
    base.mkdir(parents=True)
    (base / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],  # read by the engine's own reader
                "vocab_size": 64,
                "num_hidden_layers": 1,
                "hidden_size": HIDDEN,
                "num_attention_heads": HEADS,
                "num_key_value_heads": KV_HEADS,
                "intermediate_size": INTERMEDIATE,
            }
        )
    )
    with sessions() as s:
        registry.register_model(
            s, name="fake", source=str(base), format="safetensors", context_length=512
        )
        a = store.create_tenant(s, name="alpha")
        store.create_tenant(s, name="beta")
        key_a = store.create_key(s, tenant_name="alpha", pepper=PEPPER).secret
        key_b = store.create_key(s, tenant_name="beta", pepper=PEPPER).secret
        store.create_tenant(s, name="gamma")
        store.set_limits(s, tenant_name="gamma", allowed_models=["fake:shared"])
        narrow = store.create_key(s, tenant_name="gamma", pepper=PEPPER).secret
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    # The engine has the registered model's shape, so that the uploaded adapters load;
    # it reports no adapter slots, so the gateway's own counts are its lora series.
    engine = adapter_test_engine(ARCHIVE_SHAPE, report_lora=False)
    app = build_app(settings, engine=engine)
    with TestClient(app) as client:
        yield Live(
            client,
            engine,
            sessions,
            {"Authorization": f"Bearer {admin}"},
            key_a,
            key_b,
            a.id,
            narrow,
        )
    for writer in app.state.background_writers:
        writer.close()
    app.state.metering.close()


@pytest.fixture(scope="module")
def uploaded(live: Live) -> float:
    """Uploads alpha's private "my-adapter" and a public "shared"; seconds to load both."""
    started = time.monotonic()
    assert live.upload("my-adapter", "alpha").status_code == 201
    assert live.upload("shared", None).status_code == 201

    def servable() -> bool:
        with live.sessions() as s:
            statuses = set(s.scalars(select(LoraAdapter.status)))
        loaded = {"my-adapter", "shared"} <= set(live.engine.loaded_adapters)
        return (
            loaded
            and statuses == {"loaded"}
            and live.chat(live.key_a, "fake:shared").status_code == 200
        )

    wait_for(servable)
    return time.monotonic() - started


def _audit(live: Live, resource: str) -> list[AuditEvent]:
    live.client.app.state.admin_services.audit_writer.flush()  # type: ignore[attr-defined]
    with live.sessions() as s:
        return list(s.scalars(select(AuditEvent).where(AuditEvent.resource == resource)))


def test_an_uploaded_adapter_is_served_within_5s_and_billed_under_its_name(
    live: Live, uploaded: float
) -> None:
    assert uploaded < LOAD_WITHIN_S
    info = live.engine.loaded_adapters["my-adapter"]
    assert info.rank == 4 and info.alpha == 8.0 and len(info.digest) == 64
    reply = live.sdk(live.key_a).chat.completions.create(
        model="fake:my-adapter", messages=[{"role": "user", "content": "hello"}], max_tokens=4
    )
    assert reply.model == "fake:my-adapter"
    assert live.engine.adapter_of[reply.id] == "my-adapter"

    def recorded() -> bool:
        with live.sessions() as s:
            return s.get(UsageRow, reply.id) is not None

    wait_for(recorded)
    with live.sessions() as s:
        row = s.get(UsageRow, reply.id)
        assert row is not None and (row.model, row.adapter) == ("fake", "my-adapter")
        assert row.completion_tokens == 4


def test_another_tenants_private_adapter_is_the_same_404_as_an_unknown_one(
    live: Live, uploaded: float
) -> None:
    submitted = len(live.engine.adapter_of)
    forbidden = live.chat(live.key_b, "fake:my-adapter")
    unknown = live.chat(live.key_b, "fake:no-such-adapter")
    assert forbidden.status_code == unknown.status_code == 404
    body_f, body_u = forbidden.json(), unknown.json()
    assert body_f["error"]["code"] == "model_not_found"
    # Names never leak: the two bodies differ only in the name asked for.
    assert json.dumps(body_f).replace("my-adapter", "X") == json.dumps(body_u).replace(
        "no-such-adapter", "X"
    )
    with pytest.raises(openai.NotFoundError):
        live.sdk(live.key_b).completions.create(model="fake:my-adapter", prompt="x", max_tokens=2)
    assert len(live.engine.adapter_of) == submitted  # nothing reached the engine
    beta = _tenant(live, "beta")
    denied = _audit(live, "fake:my-adapter")
    assert denied and {(e.outcome, e.tenant_id, e.action) for e in denied} == {
        ("denied:404", beta, "access.denied")
    }
    assert sum((e.detail or {})["reasons"].get("adapter_forbidden", 0) for e in denied) == 2
    (probe,) = _audit(live, "fake:no-such-adapter")
    assert probe.outcome == "denied:404" and probe.detail == {**(probe.detail or {}), "count": 1}
    assert (probe.detail or {})["reasons"] == {"adapter_unknown": 1}


def _tenant(live: Live, name: str) -> str:
    with live.sessions() as s:
        return store.get_tenant(s, name).id


def test_a_public_adapter_serves_every_tenant(live: Live, uploaded: float) -> None:
    for key in (live.key_a, live.key_b):
        r = live.chat(key, "fake:shared")
        assert r.status_code == 200 and r.json()["model"] == "fake:shared"
        assert live.engine.adapter_of[r.json()["id"]] == "shared"


def test_completions_and_responses_select_adapters_too(live: Live, uploaded: float) -> None:
    sdk = live.sdk(live.key_b)
    done = sdk.completions.create(model="fake:shared", prompt="hi", max_tokens=2)
    assert done.model == "fake:shared" and live.engine.adapter_of[done.id] == "shared"
    before = len(live.engine.adapter_of)
    reply = sdk.responses.create(model="fake:shared", input="hi", max_output_tokens=2)
    assert reply.model == "fake:shared"
    assert list(live.engine.adapter_of.values())[before:] == ["shared"]
    with pytest.raises(openai.NotFoundError):
        sdk.responses.create(model="fake:my-adapter", input="hi", max_output_tokens=2)


def test_models_lists_adapters_for_the_tenants_that_may_use_them(
    live: Live, uploaded: float
) -> None:
    ids_a = [m.id for m in live.sdk(live.key_a).models.list()]
    ids_b = [m.id for m in live.sdk(live.key_b).models.list()]
    assert ids_a == ["fake", "fake:my-adapter", "fake:shared"]
    assert ids_b == ["fake", "fake:shared"]
    auth_b = {"Authorization": f"Bearer {live.key_b}"}
    assert live.client.get("/v1/models/fake:my-adapter", headers=auth_b).status_code == 404


def test_a_model_list_naming_an_adapter_allows_that_adapter_only(
    live: Live, uploaded: float
) -> None:
    assert live.chat(live.key_narrow, "fake:shared").status_code == 200
    assert live.chat(live.key_narrow, "fake").status_code == 403  # not the base model itself
    assert [m.id for m in live.sdk(live.key_narrow).models.list()] == ["fake:shared"]


def test_adapter_metrics(live: Live, uploaded: float) -> None:
    assert live.chat(live.key_a, "fake:shared").status_code == 200
    text = live.client.get("/metrics").text
    assert 'vllm:lora_requests_info{max_lora="0",model_name="fake",running_lora_adapters=""' in text
    lines = [ln for ln in text.splitlines() if ln.startswith("cloister_adapter_requests_total")]
    counts = {ln.split('adapter="')[1].split('"')[0]: float(ln.split()[-1]) for ln in lines}
    assert counts["shared"] >= 3 and counts["my-adapter"] >= 1
    # The console's view (GET /adapters/runtime): where each adapter is, and its traffic.
    runtime = live.client.get("/admin/api/v1/adapters/runtime", headers=live.admin).json()
    assert runtime["shared"] == {"state": "device", "requests": counts["shared"]}
    assert runtime["my-adapter"]["requests"] == counts["my-adapter"]


def test_a_retired_adapter_is_unloaded_once_no_request_uses_it(live: Live, uploaded: float) -> None:
    live.engine.pinned_adapters.add("shared")  # a request still runs on it
    r = live.client.patch(
        "/admin/api/v1/adapters/shared", json={"status": "retired"}, headers=live.admin
    )
    assert r.status_code == 200
    wait_for(lambda: live.chat(live.key_a, "fake:shared").status_code == 404)
    time.sleep(0.5)  # more than one sync period: the in-use adapter stays loaded
    assert "shared" in live.engine.loaded_adapters
    live.engine.pinned_adapters.discard("shared")
    wait_for(lambda: "shared" not in live.engine.loaded_adapters)
    assert "my-adapter" in live.engine.loaded_adapters
    with live.sessions() as s:
        assert registry.get_adapter(s, "shared").status == "retired"
