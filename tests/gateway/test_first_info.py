"""A gateway finds its first engine server among several, waiting while none answers.

Before, a replica set asked only the first URL it resolved: `--engine-urls A,B` with A
down kept the gateway from starting for the whole wait (120 s) and then failed, though
B served. A real HTTP server stands in for an engine server's /internal/info.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine_hop.remote_client import first_info
from engine_hop.remote_errors import EngineUnavailableError
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.services import free_port

TOKEN = "svc-first-info-token"
INFO = {"model_name": "m", "max_model_len": 512, "vocab_size": 1000, "num_blocks": 64}


async def _info(request: Request) -> Response:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": {"message": "no"}}, status_code=401)
    return JSONResponse({**INFO, "block_size": 16})


@pytest.fixture(scope="module")
def live() -> Iterator[str]:
    url, stop = serve_in_thread(Starlette(routes=[Route("/internal/info", _info)]))
    yield url
    stop()


def test_a_down_replica_first_does_not_hold_the_gateway_back(live: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    url, info = first_info(lambda: [dead, live], TOKEN, wait_s=0.0, described="both")
    assert url == live and info.model_name == "m" and info.block_size == 16


def test_it_resolves_again_while_it_waits_and_says_so_once(
    live: str, caplog: pytest.LogCaptureFixture
) -> None:
    rounds: list[float] = []

    def candidates() -> list[str]:  # a headless Service with no ready pod, then one
        rounds.append(time.monotonic())
        return [] if len(rounds) < 3 else [live]

    with caplog.at_level(logging.WARNING, logger="cloister.gateway.remote"):
        url, _ = first_info(candidates, TOKEN, wait_s=30.0, described="dns+http://engines:8100")
    assert url == live and len(rounds) == 3
    waits = [r.getMessage() for r in caplog.records if "waiting up to 30 s" in r.getMessage()]
    assert waits == [
        "waiting up to 30 s for an engine server at dns+http://engines:8100 "
        "(no address resolves yet)"
    ]


def test_none_answering_is_a_clear_error_after_the_wait() -> None:
    dead = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    start = time.monotonic()
    with pytest.raises(EngineUnavailableError) as raised:
        first_info(lambda: dead, TOKEN, wait_s=0.6, described=", ".join(dead))
    assert time.monotonic() - start >= 0.6
    message = str(raised.value)
    assert message.startswith(f"no engine server answered at {', '.join(dead)} (")
    assert all(f"{url}: " in message for url in dead)


def test_a_refused_credential_fails_at_once(live: str) -> None:
    start = time.monotonic()
    with pytest.raises(EngineUnavailableError, match="refused the service credential"):
        first_info(lambda: [live], "svc-wrong", wait_s=30.0, described=live)
    assert time.monotonic() - start < 10
