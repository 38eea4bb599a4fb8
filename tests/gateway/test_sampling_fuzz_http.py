"""Property, over HTTP: any JSON number in any sampling field is a 200 or a 400, never a 5xx.

While the fuzz runs, another tenant streams the same greedy completion again and
again; every one of its streams must come back complete and unchanged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.utils.live_gateway import LiveGateway, started_gateway

FIELDS = [
    "temperature",
    "top_p",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "max_tokens",
    "top_k",
    "min_p",
    "repetition_penalty",
    "best_of",
    "logit_bias",
    "stop",
    "cache",
]
# What json.loads takes besides plain numbers: the non-finite literals, and overflow.
LITERALS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-400", "-0.0", "1e-300", "5e-324"]
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.sampled_from([0, 1, 2, 16, 17, 20, 21, -1, 1e-5, 9e-6, 1e-38]).map(json.dumps),
    LITERALS,
)
VICTIM = {"prompt": "Write a poem about the tides.", "max_tokens": 24, "temperature": 0}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway over the tiny engine for the whole fuzz."""
    with started_gateway(tmp_path_factory.mktemp("fuzz")) as gw:
        yield gw


def _victim_text(gw: LiveGateway, key: str) -> str:
    text = ""
    body = {"model": gw.model, "stream": True, **VICTIM}
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream(
        "POST", gw.base_url + "/v1/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    for data in lines[:-1]:
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        text += "".join(c["text"] for c in chunk["choices"])
    return text


@pytest.mark.slow
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(field=st.sampled_from(FIELDS), literal=NUMBERS, chat=st.booleans())
@example(field="top_p", literal="1e-300", chat=False)  # issue 13: crashed every tenant's step
@example(field="top_p", literal="5e-324", chat=True)
@example(field="repetition_penalty", literal="1e-300", chat=False)
@example(field="seed", literal=str(10**30), chat=True)
def test_any_number_in_any_sampling_field_is_a_200_or_a_400(
    gateway: LiveGateway, field: str, literal: str, chat: bool
) -> None:
    keys = _keys(gateway)
    value = f'{{"5": {literal}}}' if field == "logit_bias" else literal
    if chat:
        url = "/v1/chat/completions"
        head = '"messages": [{"role": "user", "content": "hi"}]'
        if field == "logprobs":
            field = "top_logprobs"  # chat's logprobs is a bool; its count is top_logprobs
    else:
        url, head = "/v1/completions", '"prompt": "hi"'
    fields = {"max_tokens": "3", field: value}
    body = f'{{"model": "{gateway.model}", {head}, ' + ", ".join(
        f'"{k}": {v}' for k, v in fields.items()
    )
    body += "}"
    r = httpx.post(
        gateway.base_url + url,
        content=body,
        headers={"Authorization": f"Bearer {keys['attacker']}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code in (200, 400), (field, literal, r.status_code, r.text)
    payload = r.json()
    if r.status_code == 400:
        assert set(payload["error"]) == {"message", "type", "param", "code"}
    else:
        assert payload["choices"], payload


_state: dict[str, Any] = {}


def _keys(gw: LiveGateway) -> dict[str, str]:
    """The fuzz's tenants, made once, and the victim's thread, started once."""
    if "attacker" not in _state:
        _state["attacker"] = gw.tenant("fuzzer")
        victim = gw.tenant("bystander")
        _state["expected"] = _victim_text(gw, victim)
        _state["results"] = []
        _state["stop"] = threading.Event()

        def loop() -> None:
            while not _state["stop"].is_set():
                try:
                    _state["results"].append(_victim_text(gw, victim))
                except BaseException as exc:  # recorded; asserted by the next test
                    _state["results"].append(exc)

        _state["thread"] = threading.Thread(target=loop, daemon=True)
        _state["thread"].start()
    return {"attacker": _state["attacker"]}


@pytest.mark.slow
def test_the_bystander_streamed_unchanged_throughout(gateway: LiveGateway) -> None:
    assert "thread" in _state, "the fuzz did not run"
    _state["stop"].set()
    _state["thread"].join(60)
    results = _state["results"]
    assert len(results) >= 3
    assert all(r == _state["expected"] for r in results), [
        r for r in results if r != _state["expected"]
    ][:3]
    engine = gateway.engine.engine
    assert not engine.has_unfinished()
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    engine.kv.check_integrity()
