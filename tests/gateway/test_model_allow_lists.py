"""The registry's per-model tenant allow-lists drive what the gateway serves, and usage of
a model with no price is marked unpriced in the billing export (issue 14 §2).

Runs the real `cloister serve` wiring (`build_app`, admin API beside the gateway) under
uvicorn on the fast fake engine, driven with the openai SDK and plain HTTP.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.identity import create_admin_token
from assembly.app import build_app
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.principals import PEPPER

REFRESH_S = 1.0
MESSAGES = [{"role": "user", "content": "hello there"}]


@dataclass
class Served:
    """A running `build_app` server and what the tests drive it with."""

    base_url: str
    app: Any
    sessions: sessionmaker[Session]
    admin: httpx.Client
    tenant_ids: dict[str, str]
    keys: dict[str, str]

    def client(self, tenant: str) -> OpenAI:
        """An OpenAI SDK client with `tenant`'s key and no retries."""
        return OpenAI(
            base_url=self.base_url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=30
        )

    def chat(self, tenant: str) -> Any:
        """One small chat completion of model "tiny"."""
        return self.client(tenant).chat.completions.create(
            model="tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
        )

    def patch_model(self, **body: Any) -> httpx.Response:
        """PATCH /admin/api/v1/models/tiny."""
        return self.admin.patch("/admin/api/v1/models/tiny", json=body)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    settings = Settings(
        data_dir=tmp_path, key_pepper=PEPPER, model_name="tiny", config_refresh_s=REFRESH_S
    )
    upgrade_database(settings.resolved_database_url)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    tenant_ids: dict[str, str] = {}
    keys: dict[str, str] = {}
    with sessions() as s:
        for name in ("alpha", "beta"):
            tenant_ids[name] = store.create_tenant(s, name=name).id
            keys[name] = store.create_key(s, tenant_name=name, pepper=PEPPER).secret
        # No price: its usage must come out marked unpriced.
        registry.register_model(s, name="tiny", source="/m", format="gguf", context_length=512)
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    app = build_app(settings, engine=gateway_test_engine())
    base_url, stop = serve_in_thread(app)
    client = httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {admin}"}, timeout=30
    )
    try:
        yield Served(base_url, app, sessions, client, tenant_ids, keys)
    finally:
        client.close()
        stop()
        for writer in app.state.background_writers:
            writer.close()
        app.state.metering.close()


def _eventually(check: Callable[[], bool], *, within_s: float) -> float:
    """Seconds until `check()` held; fails after `within_s`."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > within_s:
            raise AssertionError(f"not seen within {within_s}s")
        time.sleep(0.05)
    return time.monotonic() - start


def _denied(served: Served, tenant: str) -> bool:
    try:
        served.chat(tenant)
    except openai.PermissionDeniedError:
        return True
    return False


def _listed(served: Served, tenant: str) -> list[str]:
    return [m.id for m in served.client(tenant).models.list().data]


def test_an_allow_list_denies_another_tenant_and_hides_the_model(served: Served) -> None:
    assert served.chat("beta").choices  # public: every tenant
    r = served.patch_model(allowed_tenants=[served.tenant_ids["alpha"]])
    assert r.status_code == 200 and r.json()["allowed_tenants"] == [served.tenant_ids["alpha"]]
    waited = _eventually(lambda: _denied(served, "beta"), within_s=REFRESH_S + 2.0)
    assert waited <= REFRESH_S + 2.0

    with pytest.raises(openai.PermissionDeniedError) as refused:
        served.chat("beta")
    assert refused.value.status_code == 403
    body = refused.value.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "model_not_allowed"  # as for a key's own allow-list
    assert body["error"]["type"] == "permission_error" and body["error"]["param"] == "model"
    assert served.chat("alpha").choices[0].message.content is not None  # allowed: 200

    assert _listed(served, "alpha") == ["tiny"]
    assert _listed(served, "beta") == []
    assert served.client("alpha").models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as hidden:
        served.client("beta").models.retrieve("tiny")
    assert hidden.value.response.json()["error"]["code"] == "model_not_found"

    # The denial is audited like a key's model denial, with its own reason.
    audit = served.admin.get("/admin/api/v1/audit", params={"limit": 500})
    assert audit.status_code == 200
    denials = [
        e for e in audit.json()["items"] if e["outcome"] == "denied:403" and e["resource"] == "tiny"
    ]
    assert denials and all(e["tenant_id"] == served.tenant_ids["beta"] for e in denials)
    assert {reason for e in denials for reason in e["detail"]["reasons"]} == {"model_tenant"}

    # Public again: seen within the refresh.
    assert served.patch_model(clear_allowed_tenants=True).status_code == 200
    _eventually(lambda: not _denied(served, "beta"), within_s=REFRESH_S + 2.0)
    assert _listed(served, "beta") == ["tiny"]


def test_refusals_bill_nothing_and_unpriced_usage_is_marked_in_the_export(
    served: Served,
) -> None:
    assert served.patch_model(allowed_tenants=[served.tenant_ids["alpha"]]).status_code == 200
    _eventually(lambda: _denied(served, "beta"), within_s=REFRESH_S + 2.0)
    assert served.chat("alpha").usage is not None
    assert served.app.state.metering.flush()

    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    r = served.admin.get(
        "/admin/api/v1/billing/export", params={"period": period, "format": "jsonl"}
    )
    assert r.status_code == 200, r.text
    lines = [json.loads(x) for x in r.text.splitlines()]
    by_tenant = {(x["tenant_id"], x["status"]): x for x in lines if x["record"] == "line"}
    used = by_tenant[(served.tenant_ids["alpha"], 200)]
    assert used["section"] == "unpriced" and used["requests"] == 1
    assert used["total_usd"] == "0.000000000000" and used["input_tokens"] > 0
    assert used["tenant_name"] == "alpha"
    refused = by_tenant[(served.tenant_ids["beta"], 403)]
    assert (refused["input_tokens"], refused["output_tokens"], refused["total_usd"]) == (
        0,
        0,
        "0.000000000000",
    )
    assert refused["section"] == "not_billed"  # refused: never billable

    csv_text = served.admin.get(
        "/admin/api/v1/billing/export", params={"period": period, "format": "csv"}
    ).text
    csv_rows = {
        (r["tenant_id"], r["status"]): r
        for r in csv.DictReader(io.StringIO(csv_text))
        if r["record"] == "line"
    }
    alpha_row = csv_rows[(served.tenant_ids["alpha"], "200")]
    assert (alpha_row["section"], alpha_row["requests"]) == ("unpriced", "1")

    # The console's usage API marks it too.
    start = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).isoformat()
    end = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    usage = served.admin.get("/admin/api/v1/usage", params={"start": start, "end": end}).json()
    alpha = served.tenant_ids["alpha"]
    marks = [b["unpriced"] for b in usage["items"] if (b["tenant_id"], b["status"]) == (alpha, 200)]
    assert marks == [True]


@pytest.mark.parametrize(
    "body",
    [
        {"allowed_tenants": "ten_x"},  # not a list
        {"allowed_tenants": [123]},  # not ids
        {"allowed_tenants": [None]},
        {"allowed_tenants": ["ten_doesnotexist"]},  # no such tenant
        {"allowed_tenants": ["alpha"]},  # a name, not an id
        {"allowed_tenants": {"a": 1}},
    ],
)
def test_bad_allow_lists_are_refused_with_4xx(served: Served, body: dict[str, Any]) -> None:
    r = served.patch_model(**body)
    assert 400 <= r.status_code < 500, r.text
    model = served.admin.get("/admin/api/v1/models/tiny").json()
    assert model["allowed_tenants"] is None  # unchanged
    assert served.chat("beta").choices  # still public


def test_a_tenant_name_is_refused_with_a_hint(served: Served) -> None:
    r = served.patch_model(allowed_tenants=["alpha"])
    assert r.status_code == 400 and "give their ids" in r.text


def test_register_checks_the_allow_list_and_without_a_price_is_unpriced(
    served: Served, tmp_path: Path
) -> None:
    weights = tmp_path / "models" / "w.gguf"
    weights.parent.mkdir(exist_ok=True)
    weights.write_bytes(b"GGUF")
    body = {"source": str(weights), "format": "gguf", "context_length": 64}
    bad = served.admin.post(
        "/admin/api/v1/models", json={**body, "name": "m1", "allowed_tenants": ["ten_nope"]}
    )
    assert bad.status_code == 400, bad.text
    assert served.admin.get("/admin/api/v1/models/m1").status_code == 404  # nothing registered
    alpha = served.tenant_ids["alpha"]
    ok = served.admin.post(
        "/admin/api/v1/models", json={**body, "name": "m1", "allowed_tenants": [alpha]}
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["allowed_tenants"] == [alpha] and ok.json()["price"] is None
    free = served.admin.post(
        "/admin/api/v1/models", json={**body, "name": "m2", "input_price": 0, "output_price": 0}
    )
    assert free.status_code == 201 and free.json()["price"]["input_price"] == 0  # priced at 0


def test_a_models_output_cap_applies_beside_the_keys(served: Served) -> None:
    client = served.client("alpha")

    def refused(max_tokens: int) -> bool:
        try:
            client.chat.completions.create(
                model="tiny",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=max_tokens,
            )
        except openai.BadRequestError:
            return True
        return False

    assert not refused(8)
    r = served.patch_model(max_output_tokens=6)
    assert r.status_code == 200 and r.json()["max_output_tokens"] == 6
    _eventually(lambda: refused(7), within_s=REFRESH_S + 2.0)
    with pytest.raises(openai.BadRequestError) as over:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7)  # type: ignore[arg-type]
    err = over.value.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == "max_tokens" and "model 'tiny' allows at most 6" in err["message"]
    # A default is clamped to the model's cap (the fast fake model writes max_tokens tokens), and the
    # Responses API's max_output_tokens takes the same path.
    out = client.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.completion_tokens == 6
    resp = httpx.post(
        served.base_url + "/v1/responses",
        headers={"Authorization": f"Bearer {served.keys['alpha']}"},
        json={"model": "tiny", "input": "hi", "max_output_tokens": 7},
        timeout=30,
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_output_tokens"
    # The smaller cap wins: a key's own below the model's.
    with served.sessions() as s:
        store.set_limits(s, tenant_name="alpha", max_output_tokens=4)
    _eventually(lambda: refused(5), within_s=REFRESH_S + 2.0)
    out = client.chat.completions.create(model="tiny", messages=MESSAGES)  # type: ignore[arg-type]
    assert out.usage is not None and out.usage.completion_tokens == 4
    # Another tenant is held to the model's cap alone; null gives it back to the context.
    beta = served.client("beta").chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=6,
    )
    assert beta.usage is not None and beta.usage.completion_tokens == 6
    assert served.patch_model(max_output_tokens=None).json()["max_output_tokens"] is None
    _eventually(
        lambda: (
            served.client("beta")
            .chat.completions.create(
                model="tiny",
                messages=MESSAGES,  # type: ignore[arg-type]
            )
            .usage.completion_tokens  # type: ignore[union-attr]
            > 6
        ),
        within_s=REFRESH_S + 2.0,
    )
