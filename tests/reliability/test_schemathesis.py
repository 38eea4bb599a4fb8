"""Schemathesis over the live server's two OpenAPI documents (the tenant API's, the admin
API's): valid and invalid requests to every operation, and never a 5xx other than 503
with Retry-After, never an error body outside OpenAI's format, never an answer
without x-request-id. On SQLite and on PostgreSQL: the production database refuses
values SQLite takes (a NUL in a name looked up was a 500 there only)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from admin.identity import create_admin_token
from tests.gateway.processes import create_tenant_key, database, spawn_gateway, stop, wait_ready
from tests.reliability.live import Bystanders, Reply, problems, server_errors
from tests.utils.hostile_server import SERVER_SETTINGS, LiveServer
from tests.utils.principals import PEPPER
from tests.utils.services import postgres_database
from tests.utils.tiny_model import make_tiny_model_dir

EXAMPLES_PER_MODE = 6
OPENAI_PATHS = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/responses/{response_id}",
    "/v1/models",
    "/health",
}
TENANT_DOCUMENT = "/openapi.json"
ADMIN_DOCUMENT = "/admin/api/openapi.json"


def test_tenant_and_admin_documents_are_apart(live_server: LiveServer) -> None:
    doc = httpx.get(live_server.base_url + TENANT_DOCUMENT, timeout=30).json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) >= OPENAI_PATHS, sorted(doc["paths"])
    assert not [p for p in doc["paths"] if p.startswith("/admin")]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"TenantKey": []}]
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/ChatCompletionRequest")
    schemas = doc["components"]["schemas"]
    assert {"temperature", "top_p", "messages", "stream"} <= set(
        schemas["ChatCompletionRequest"]["properties"]
    )
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(doc)))
    assert refs and refs <= set(schemas), refs - set(schemas)
    admin = httpx.get(live_server.base_url + ADMIN_DOCUMENT, timeout=30).json()
    assert admin["openapi"].startswith("3.1")
    assert {"/admin/api/v1/tenants", "/admin/api/v1/usage"} <= set(admin["paths"])
    assert all(p.startswith("/admin/api/") for p in admin["paths"])
    assert admin["paths"]["/admin/api/v1/tenants"]["get"]["security"] == [{"AdminToken": []}]
    for page, path in (("/docs", "/v1/chat/completions"), ("/admin/docs", "/admin/api/v1/tenants")):
        docs = httpx.get(live_server.base_url + page, timeout=30)
        assert docs.status_code == 200 and path in docs.text


def _reply(response: Any, what: str) -> Reply:
    return Reply(
        response.status_code,
        {k.lower(): v for k, v in response.headers.items()},
        response.content.decode(errors="replace"),
        what,
    )


def fuzz_operation(server: LiveServer, strategy: Any, label: str, found: list[str]) -> int:
    """Sends EXAMPLES_PER_MODE cases of `strategy`; adds each problem to `found`; returns
    how many calls it made (0 when no case can be made, e.g. invalid input to an
    operation that takes none)."""
    calls = 0

    @settings(
        max_examples=EXAMPLES_PER_MODE,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: Any) -> None:
        nonlocal calls
        calls += 1
        what = (
            f"{label} {case.method} {case.formatted_path} query={case.query!r:.200} "
            f"body={case.body!r:.300}"
        )
        try:
            response = case.call(base_url=server.base_url, timeout=120)
        except Exception as exc:  # a dropped connection is a finding, not a crash
            found.append(f"{what}: no response: {exc!r}")
            return
        found.extend(problems(_reply(response, what)))
        if "x-request-id" not in response.headers:
            found.append(f"{what}: no x-request-id -> {response.status_code}")

    with contextlib.suppress(Unsatisfiable):  # no invalid input exists for this operation
        one()
    return calls


@pytest.fixture(scope="module")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`cloister serve` as the suite's live server is, on its own PostgreSQL database."""
    root = tmp_path_factory.mktemp("fuzz-postgres")
    with postgres_database() as url:
        sessions = database(root / "data", url)
        attacker = create_tenant_key(sessions, "attacker")
        with sessions() as s:
            token = create_admin_token(s, pepper=PEPPER, role="admin", name="fuzz").secret
        model = make_tiny_model_dir(root, tie=False)
        gw = spawn_gateway(
            root / "data", model, root / "server.log", database_url=url, **SERVER_SETTINGS
        )
        try:
            wait_ready(gw)
            yield LiveServer(gw, root / "data", model, token, attacker, Bystanders(gw.base_url, []))
        finally:
            stop(gw)


@pytest.mark.slow
@pytest.mark.parametrize("server_fixture", ["live_server", "postgres_server"])
def test_no_server_errors_anywhere_in_the_openapi_document(
    server_fixture: str, request: pytest.FixtureRequest
) -> None:
    live_server: LiveServer = request.getfixturevalue(server_fixture)
    operations = []
    for document in (TENANT_DOCUMENT, ADMIN_DOCUMENT):
        schema = schemathesis.openapi.from_url(live_server.base_url + document)
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result.err()
            operations.append(result.ok())
    paths = {op.path for op in operations}
    assert paths >= OPENAI_PATHS and "/admin/api/v1/tenants" in paths
    found: list[str] = []
    for operation in operations:
        admin = operation.path.startswith("/admin")
        token = live_server.admin_token if admin else live_server.attacker_key
        headers = {"Authorization": f"Bearer {token}"}
        calls = 0
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategy = operation.as_strategy(generation_mode=mode, headers=headers)
            calls += fuzz_operation(live_server, strategy, mode.value, found)
        assert calls > 0, f"no request was made to {operation.label}"
    assert found == [], "\n".join([*found, "server errors:", *server_errors(live_server.gw)])
