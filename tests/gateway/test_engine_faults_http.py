"""Over HTTP: one tenant's bad or poisoned request never hurts another tenant's stream.

The engine under the gateway has an injected fault (tests/utils/faulty_engine.py):
it raises whenever the request seeded with POISON_SEED is in a step. Also here:
degenerate sampling values, `cache: false`, and a request that can never fit.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.errors import RequestFailedError
from engine.fronts.async_engine import AsyncEngine
from engine.fronts.process_engine import ProcessEngine
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.faulty_engine import POISON_SEED, SECRET, faulty_engine
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.tiny_model import make_tiny_model_dir

MAX_WAITING = 32
PROMPT = "Tell me a long story about a lighthouse keeper and the sea."


ENGINE_OPTIONS: dict[str, Any] = {
    "max_model_len": 512,
    "num_blocks": 256,
    "attention_backend": "torch",
    "max_waiting": MAX_WAITING,
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """A live gateway over the faulty tiny engine, with a small waiting queue."""
    tmp = tmp_path_factory.mktemp("faults")
    engine = faulty_engine(str(make_tiny_model_dir(tmp)), "runner", **ENGINE_OPTIONS)
    gw, stop = start_gateway(
        tmp, engine=AsyncEngine(engine), limiter=MemoryLimiter(), max_waiting=MAX_WAITING
    )
    yield gw
    stop()


@pytest.fixture
def process_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """The same, with the faulty engine in a child process (`engine_mode = "process"`)."""
    factory = functools.partial(
        faulty_engine, str(make_tiny_model_dir(tmp_path)), "runner", **ENGINE_OPTIONS
    )
    gw, stop = start_gateway(
        tmp_path, engine=ProcessEngine(factory), limiter=MemoryLimiter(), max_waiting=MAX_WAITING
    )
    yield gw
    stop()


def post(gw: LiveGateway, key: str, body: dict[str, Any]) -> httpx.Response:
    body = {"model": gw.model, **body}
    return httpx.post(
        gw.base_url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def stream_text(gw: LiveGateway, key: str, body: dict[str, Any]) -> tuple[str, list[str]]:
    """The streamed text of a completion and its raw `data:` events."""
    body = {"model": gw.model, "stream": True, **body}
    events: list[str] = []
    with httpx.stream(
        "POST",
        gw.base_url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    text = ""
    for data in events:
        if data != "[DONE]" and '"choices"' in data:
            text += "".join(c["text"] for c in httpx.Response(200, content=data).json()["choices"])
    return text, events


VICTIM = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0}


def _while_victim_streams(gw: LiveGateway, attack: Any) -> tuple[str, Any]:
    """Runs `attack()` while another tenant streams VICTIM; returns (victim text, attack result).

    Asserts that the attack ended before the victim's stream did, so they overlapped.
    """
    victim = gw.tenant(f"victim-{len(gw.secrets)}")
    result: dict[str, Any] = {}

    def run_victim() -> None:
        result["victim"] = stream_text(gw, victim, VICTIM)
        result["victim_done"] = True

    thread = threading.Thread(target=run_victim)
    thread.start()
    # Wait until the victim is decoding, then attack.
    while gw.engine.stats().num_running == 0 and thread.is_alive():
        time.sleep(0.002)
    outcome = attack()
    attack_ended_first = "victim_done" not in result
    thread.join(120)
    assert attack_ended_first, "the victim finished before the attack: no overlap"
    text, events = result["victim"]
    assert events[-1] == "[DONE]"
    assert not any('"error"' in e for e in events)
    return text, outcome


def test_a_poisoned_request_fails_alone_and_says_nothing_internal(gateway: LiveGateway) -> None:
    _poison_while_another_streams(gateway)


@pytest.mark.slow
def test_the_same_through_the_engine_process(process_gateway: LiveGateway) -> None:
    _poison_while_another_streams(process_gateway, in_process_log=False)


def _poison_while_another_streams(gateway: LiveGateway, *, in_process_log: bool = True) -> None:
    alone, _ = stream_text(gateway, gateway.tenant("reference"), VICTIM)
    attacker = gateway.tenant("attacker")
    poison = {"prompt": "poison", "max_tokens": 50, "temperature": 0, "seed": POISON_SEED}

    text, r = _while_victim_streams(gateway, lambda: post(gateway, attacker, poison))
    assert text == alone
    assert r.status_code == 500
    assert r.json()["error"] == {
        "message": RequestFailedError.MESSAGE,
        "type": "server_error",
        "param": None,
        "code": "engine_error",
    }
    assert SECRET not in r.text

    # Streamed, the failure arrives in-band, with the same words.
    text, (_, events) = _while_victim_streams(
        gateway, lambda: stream_text(gateway, attacker, poison)
    )
    assert text == alone
    errors = [e for e in events if '"error"' in e]
    assert len(errors) == 1 and SECRET not in errors[0]
    assert '"code":"engine_error"' in errors[0].replace(" ", "")
    assert RequestFailedError.MESSAGE in errors[0]
    if in_process_log:  # the cause is in the server's log (a child logs to its stderr)
        assert SECRET in gateway.logs.getvalue()


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 5e-324, 1e-9])
def test_a_top_p_too_small_to_mean_anything_is_a_400(gateway: LiveGateway, top_p: float) -> None:
    key = gateway.tenant(f"tiny-top-p-{len(gateway.secrets)}")
    body = {"prompt": PROMPT, "max_tokens": 4, "top_p": top_p}
    text, r = _while_victim_streams(gateway, lambda: post(gateway, key, body))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "top_p"
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_tiny_temperature_means_greedy(gateway: LiveGateway) -> None:
    key = gateway.tenant("cold")
    greedy = post(gateway, key, {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}).json()
    for temperature in (1e-38, 5e-324, 1e-6):
        body = {"prompt": PROMPT, "max_tokens": 12, "temperature": temperature, "top_p": 0.5}
        r = post(gateway, key, body)
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_cache_false_neither_reads_nor_writes_the_cache(gateway: LiveGateway) -> None:
    key = gateway.tenant("no-cache")
    body = {"prompt": "Summarise the plot of a long novel. " * 8, "max_tokens": 2}

    def cached(**extra: Any) -> int:
        r = post(gateway, key, {**body, **extra})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    assert cached(cache=False) == 0
    assert cached(cache=False) == 0  # an identical request does not read the cache
    assert cached(cache=True) == 0  # and the two before it wrote nothing to it
    assert cached() > 0  # the cache itself works: this one hits what the last one wrote
    assert cached(cache=False) == 0
    r = post(gateway, key, {**body, "cache": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache"


def test_a_request_that_can_never_fit_is_a_400_not_a_503(gateway: LiveGateway) -> None:
    key = gateway.tenant("greedy-for-sequences")
    # 3 prompts x n=16 = 48 sequences; the engine queues at most 32, even idle.
    r = post(gateway, key, {"prompt": ["a", "b", "c"], "n": 16, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "Retry-After" not in r.headers
    error = r.json()["error"]
    assert error["code"] == "request_too_large" and error["param"] == "n"
    assert "32" in error["message"] and "48" in error["message"]
    # Exactly what fits is served.
    r = post(gateway, key, {"prompt": ["a", "b"], "n": 16, "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 32


def test_the_engine_is_left_clean(gateway: LiveGateway) -> None:
    engine = gateway.engine.engine
    assert not engine.has_unfinished()
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    engine.kv.check_integrity()
