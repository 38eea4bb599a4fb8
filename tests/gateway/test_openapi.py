"""The tenant API's OpenAPI document: valid 3.1, every /v1 route the app serves described,
no admin route in it, and a docs page that loads nothing from elsewhere."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

from gateway.openapi import tenant_document
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, started_gateway


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway (the fast fake engine: the document does not depend on the model)."""
    with started_gateway(tmp_path_factory.mktemp("openapi"), engine=gateway_test_engine()) as gw:
        yield gw


@pytest.fixture(scope="module")
def document(gateway: LiveGateway) -> dict[str, Any]:
    """/openapi.json as served."""
    r = httpx.get(gateway.base_url + "/openapi.json", timeout=30)
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def served_v1_operations(app: Any) -> set[tuple[str, str]]:
    """(path template, method) of every /v1 route `app` serves, from its routes."""
    found = set()
    # Plain routes and those of included routers alike.
    for route in iter_route_contexts(app.routes):
        path = route.path_format or ""
        if path.startswith("/v1"):
            for method in route.methods or ():
                if method != "HEAD":  # Starlette adds HEAD to every GET
                    found.add((path, method.lower()))
    return found


def test_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"].startswith("3.1")
    validate(document, cls=OpenAPIV31SpecValidator)
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(document)))
    assert refs and refs <= set(document["components"]["schemas"])


def test_every_v1_route_is_described(gateway: LiveGateway, document: dict[str, Any]) -> None:
    served = served_v1_operations(gateway.app)
    assert ("/v1/chat/completions", "post") in served and ("/v1/models/{model}", "get") in served
    described = {
        (path, method)
        for path, item in document["paths"].items()
        if path.startswith("/v1")
        for method in item
    }
    missing = served - described
    assert not missing, f"routes without an entry in gateway/openapi.py: {sorted(missing)}"
    assert described <= served, f"described but not served: {sorted(described - served)}"
    for path, method in served:
        operation = document["paths"][path][method]
        assert operation["summary"] and operation["responses"], (path, method)
        assert operation["security"] == [{"TenantKey": []}], (path, method)


def test_request_and_response_schemas_and_request_id_headers(document: dict[str, Any]) -> None:
    chat = document["paths"]["/v1/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/ChatCompletionRequest")
    ok = chat["responses"]["200"]
    assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/ChatCompletion")
    assert {"x-request-id", "x-cloister-request-id"} <= set(ok["headers"])
    assert chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ErrorBody"
    )
    assert "x-request-id" in [p["name"] for p in chat["parameters"] if p["in"] == "header"]
    fields = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "temperature", "top_k", "min_p", "repetition_penalty"} <= set(fields)


def test_no_admin_route_in_the_tenant_document(document: dict[str, Any]) -> None:
    assert not [p for p in document["paths"] if p.startswith("/admin")]
    assert set(document["components"]["securitySchemes"]) == {"TenantKey"}


def test_docs_page_is_html_that_loads_nothing(gateway: LiveGateway) -> None:
    r = httpx.get(gateway.base_url + "/docs", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert "/v1/chat/completions" in r.text and 'href="/openapi.json"' in r.text
    assert "<script" not in r.text and "https://" not in r.text
    assert 'id="schema-ChatCompletionRequest"' in r.text


def test_document_is_built_from_the_same_table(document: dict[str, Any]) -> None:
    assert tenant_document(document["info"]["title"], document["info"]["version"]) == document


def test_output_constraints_are_described_on_both_generation_requests() -> None:
    from gateway.openapi import CONSTRAINT_PROPERTIES, gateway_components

    schemas = gateway_components()["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        properties = schemas[name]["properties"]
        assert set(CONSTRAINT_PROPERTIES) <= set(properties), name
        assert "json_schema" in properties["response_format"]["properties"]["type"]["enum"]
    assert {"tools", "tool_choice", "top_k", "min_p"} <= set(
        schemas["ChatCompletionRequest"]["properties"]
    )
