"""Bad input, auth and limits: each an OpenAI error body with the right status; the server lives on."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tenancy import store
from tests.utils.live_gateway import (
    OPERATOR_HEADERS,
    LiveGateway,
    assert_aborted_and_metered_once,
    hold_streams,
    leave_stream_early,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def post(
    gw: LiveGateway, key: str, body: Any, path: str = "/v1/chat/completions"
) -> httpx.Response:
    """Raw POST (so malformed bodies can be sent)."""
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, (str, bytes)) else {"json": body}
    return httpx.post(
        gw.base_url + path,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=60,
        **kwargs,
    )


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if param is not None:
        assert err["param"] == param
    return dict(err)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ("{not json", 400, None),
        ({"model": "tiny", "messages": "hi"}, 400, "messages"),
        ({"model": "tiny", "messages": []}, 400, "messages"),
        ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": 10**9}, 400, "max_tokens"),
        ({"model": "tiny", "messages": MESSAGES, "n": 10000}, 400, "n"),
        ({"model": "tiny", "messages": MESSAGES, "logit_bias": {"x": 1}}, 400, "logit_bias"),
        ({"model": "tiny", "messages": MESSAGES, "logit_bias": {"5": 500}}, 400, "logit_bias"),
        ({"model": "tiny", "messages": MESSAGES, "logit_bias": {"5": "a"}}, 400, "logit_bias"),
        (
            {"model": "tiny", "messages": MESSAGES, "tools": [{"type": "function"}]},
            400,
            "tools[0].function",
        ),
        ({"model": "nope", "messages": MESSAGES}, 404, "model"),
        ({"messages": MESSAGES}, 400, "model"),
    ],
)
def test_bad_input_is_a_4xx_and_server_keeps_serving(
    gateway: LiveGateway, body: Any, status: int, param: str | None
) -> None:
    key = gateway.tenant("acme")
    assert_error(post(gateway, key, body), status, param)
    ok = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
    assert ok.status_code == 200


def test_prompt_over_context_is_context_length_exceeded(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    huge = [{"role": "user", "content": "word " * 5000}]
    err = assert_error(post(gateway, key, {"model": "tiny", "messages": huge}), 400)
    assert err["code"] == "context_length_exceeded"
    r = post(gateway, key, {"model": "tiny", "prompt": [65] * 600}, "/v1/completions")
    assert assert_error(r, 400)["code"] == "context_length_exceeded"


def test_unknown_harmless_params_are_ignored(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "metadata": {"a": 1}, "zzz": 1}
    assert post(gateway, key, body).status_code == 200


def test_auth_failures_are_401(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    r = httpx.post(gateway.base_url + "/v1/chat/completions", json={}, timeout=30)
    assert_error(r, 401)
    assert_error(post(gateway, "sk-clo-" + "x" * 40, {"model": "tiny", "messages": MESSAGES}), 401)
    assert (
        post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 1}).status_code
        == 200
    )
    with gateway.sessions() as s:
        store.revoke_key(s, key_id=gateway.key_id(key))
    err = assert_error(post(gateway, key, {"model": "tiny", "messages": MESSAGES}), 401)
    assert "revoked" in err["message"]


def test_model_not_allowed_is_403(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", allowed_models=["something-else"])
    assert_error(post(gateway, key, {"model": "tiny", "messages": MESSAGES}), 403, "model")


def test_max_output_tokens_of_tenant(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", max_output_tokens=4)
    assert_error(post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 5}), 400)
    out = gateway.client(key).chat.completions.create(model="tiny", messages=MESSAGES)
    assert out.usage is not None and out.usage.completion_tokens <= 4


def test_rpm_5_sixth_is_429_with_headers(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", rpm=5)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 1}
    for i in range(5):
        r = post(gateway, key, body)
        assert r.status_code == 200
        assert r.headers["x-ratelimit-limit-requests"] == "5"
        assert r.headers["x-ratelimit-remaining-requests"] == str(4 - i)
        assert "x-ratelimit-reset-requests" in r.headers
    r = post(gateway, key, body)
    err = assert_error(r, 429)
    assert err["code"] == "rate_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    metrics = httpx.get(gateway.base_url + "/metrics", headers=OPERATOR_HEADERS).text
    assert 'cloister_limiter_rejections_total{reason="requests",tenant="acme"} 1.0' in metrics
    assert gateway.usage.records[-1].status == 429


def test_tpm_headers_on_success(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", tpm=100000)
    r = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
    assert r.status_code == 200
    assert r.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(r.headers["x-ratelimit-remaining-tokens"]) < 100000


def test_budget_stops_the_tenant(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", token_budget=200, budget_period="day")
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 8}
    statuses = [post(gateway, key, body).status_code for _ in range(40)]
    assert 200 in statuses and statuses[-1] == 429
    r = post(gateway, key, body)
    assert assert_error(r, 429)["code"] == "insufficient_quota"
    # What the admitted requests actually used stays inside the budget (reservations
    # settle to the real counts), and the budget was nearly used up before the stop.
    used = sum(
        u.prompt_tokens + u.completion_tokens for u in gateway.usage.records if u.status == 200
    )
    first_prompt = next(u.prompt_tokens for u in gateway.usage.records if u.status == 200)
    assert 200 - (first_prompt + 8) < used <= 200


def test_concurrency_2_third_parallel_stream_is_429(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme", max_concurrent=2)
    client = gateway.client(key)
    streams = hold_streams(client, MESSAGES)  # both hold their slot now
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert info.value.response.headers.get("retry-after")
    for s in streams:
        s.close()
    deadline = time.monotonic() + 20
    while True:  # closing the streams frees the slots (aborts reach the engine)
        r = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 1})
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200


def _prompt_tokens(gw: LiveGateway) -> int:
    """The prompt tokens of MESSAGES, from a request of an unlimited tenant."""
    out = gw.client(gw.tenant("probe")).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=1
    )
    assert out.usage is not None
    return out.usage.prompt_tokens


def test_tokens_in_flight_alone_over_the_cap_is_400_and_a_default_is_clamped(
    gateway: LiveGateway,
) -> None:
    prompt = _prompt_tokens(gateway)
    key = gateway.tenant("acme", max_tokens_in_flight=prompt + 10)
    before = len(gateway.usage.records)
    r = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 11})
    err = assert_error(r, 400, "max_tokens")
    assert "max_tokens_in_flight" in err["message"]
    assert err["code"] == "max_tokens_in_flight_exceeded"
    # n multiplies the output a request holds.
    r = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 6, "n": 2})
    assert_error(r, 400, "max_tokens")
    # Within the cap it runs; with no max_tokens the default shrinks to what fits.
    assert post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 10}).is_success
    out = gateway.client(key).chat.completions.create(
        model="tiny", messages=MESSAGES, extra_body={"ignore_eos": True}
    )
    assert out.usage is not None and out.usage.completion_tokens == 10
    # The refusals ran nothing and billed nothing.
    refused = [u for u in gateway.usage.records[before:] if u.status == 400]
    assert all(u.prompt_tokens == 0 and u.completion_tokens == 0 for u in refused)


def test_tokens_in_flight_429_beside_a_running_stream_then_freed(gateway: LiveGateway) -> None:
    prompt = _prompt_tokens(gateway)
    # One request of max_tokens 400 fits; a second beside it does not.
    key = gateway.tenant("acme", max_tokens_in_flight=2 * prompt + 600, rpm=1000)
    client = gateway.client(key)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 400}
    # Finished requests give their tokens back: many in a row all pass.
    for _ in range(3):
        assert post(gateway, key, {**body, "max_tokens": 300}).status_code == 200
    stream = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=400,
        stream=True,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # it holds prompt + 400 now
    r = post(gateway, key, body)
    err = assert_error(r, 429)
    assert err["type"] == "tokens_in_flight" and err["code"] == "rate_limit_exceeded"
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-requests"] == "1000"
    # A small one still fits beside it.
    assert post(gateway, key, {**body, "max_tokens": 100}).status_code == 200
    metrics = httpx.get(gateway.base_url + "/metrics", headers=OPERATOR_HEADERS).text
    assert 'cloister_limiter_rejections_total{reason="tokens_in_flight",tenant="acme"} 1.0' in (
        metrics
    )
    stream.close()  # the client leaves: its tokens come back once
    deadline = time.monotonic() + 20
    while True:
        r = post(gateway, key, body)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200, r.text
    # Every request ended, each gave back exactly what it held: nothing is in flight.
    with gateway.sessions() as s:
        tenant_id = store.get_tenant(s, "acme").id
    limiter = gateway.app.state.cloister.limits.limiter
    deadline = time.monotonic() + 5
    while limiter.open_leases() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert limiter.open_leases() == 0 and limiter.tokens_in_flight(f"t:{tenant_id}") == 0
    # One usage record per request, the refused one billed nothing.
    mine = [u for u in gateway.usage.records if u.tenant_id == tenant_id]
    assert len({u.request_id for u in mine}) == len(mine)
    assert [(u.prompt_tokens, u.completion_tokens) for u in mine if u.status == 429] == [(0, 0)]


def test_disconnect_mid_stream_aborts_and_meters_once(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    client = gateway.client(key)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=400, stream=True, temperature=0
    )
    assert_aborted_and_metered_once(gateway, leave_stream_early(stream), max_tokens=400)


def test_keys_never_appear_in_logs(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 1})
    post(gateway, key + "x", {"model": "tiny", "messages": MESSAGES})
    post(gateway, key, "{bad json")
    import logging

    logging.getLogger("test").info("leak attempt %s", f"Authorization: Bearer {key}")
    logs = gateway.logs.getvalue()
    assert '"cloister.access"' in logs and "leak attempt" in logs  # the capture works
    for secret in gateway.secrets:
        assert secret not in logs
        assert secret[len("sk-clo-") :] not in logs


def test_parallel_load_keeps_serving(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    results: list[int] = []

    def one() -> None:
        r = post(gateway, key, {"model": "tiny", "messages": MESSAGES, "max_tokens": 3})
        results.append(r.status_code)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 8
