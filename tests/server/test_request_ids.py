"""server.request_ids on a bare app: which client ids are kept, ids on an unhandled 500,
and the ids in the log records written while a request is served."""

from __future__ import annotations

import io
import json
import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.errors import install_error_handlers
from server.logging_setup import configure_logging
from server.request_ids import (
    OWN_ID_HEADER,
    REQUEST_ID_HEADER,
    RequestIds,
    current_request_ids,
    install_request_ids,
    valid_client_id,
)
from tenancy.unique_ids import UniqueIds


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("abc-123", True),
        ("a" * 128, True),
        ("!~/:;=+_.", True),
        ("a" * 129, False),
        ("", False),
        ("with space", False),
        ("new\nline", False),
        ("cr\rlf", False),
        ("nul\x00", False),
        ("del\x7f", False),
        ("caf\xe9", False),
        ("snow\u2603", False),
        (None, False),
    ],
)
def test_valid_client_id(value: str | None, kept: bool) -> None:
    assert valid_client_id(value) == (value if kept else None)


@pytest.fixture
def client() -> TestClient:
    """A FastAPI app with the gateway's error handlers and request ids."""
    app = FastAPI()
    install_error_handlers(app)
    log = logging.getLogger("cloister.test")

    @app.get("/boom")
    def boom() -> None:
        log.info("about to fail")
        raise RuntimeError("unexpected")

    @app.get("/ok")
    async def ok() -> dict[str, str | None]:
        ids = current_request_ids()
        assert ids is not None
        log.info("serving")
        return {"own": ids.own, "client": ids.client}

    install_request_ids(app, UniqueIds().next)
    return TestClient(app, raise_server_exceptions=False)


def test_unhandled_500_still_names_its_request(client: TestClient) -> None:
    r = client.get("/boom", headers={REQUEST_ID_HEADER: "mine-1"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert r.headers[REQUEST_ID_HEADER] == "mine-1"
    assert len(r.headers[OWN_ID_HEADER]) == 24  # UniqueIds' plain hex id


def test_log_records_of_a_request_carry_its_ids(client: TestClient) -> None:
    stream = io.StringIO()
    handler = configure_logging("INFO", stream=stream)
    try:
        r = client.get("/ok", headers={REQUEST_ID_HEADER: "mine-2"})
        logging.getLogger("cloister.test").info("outside any request")
    finally:
        logging.getLogger().removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    [inside] = [line for line in lines if line["message"] == "serving"]
    assert inside["request_id"] == r.json()["own"] == r.headers[OWN_ID_HEADER]
    assert inside["client_request_id"] == "mine-2" == r.headers[REQUEST_ID_HEADER]
    [outside] = [line for line in lines if line["message"] == "outside any request"]
    assert "request_id" not in outside and "client_request_id" not in outside


def test_no_client_id_echoes_the_servers(client: TestClient) -> None:
    r = client.get("/ok", headers={REQUEST_ID_HEADER: "x" * 200})
    assert r.json()["client"] is None
    assert r.headers[REQUEST_ID_HEADER] == r.headers[OWN_ID_HEADER] == r.json()["own"]


def test_a_pinned_id_survives_the_routes_assignment() -> None:
    """An in-process caller (the batch runner) fixes the id through the ASGI scope; the
    route's own `assign` then keeps it, so a retried line keeps its usage record's key."""
    ids = RequestIds(None, lambda: "drawn", pinned="batch_req_abc_3")
    assert ids.assign("chatcmpl-new") == "batch_req_abc_3" == ids.own
    free = RequestIds(None, lambda: "drawn")
    assert free.assign("chatcmpl-new") == "chatcmpl-new" == free.own
