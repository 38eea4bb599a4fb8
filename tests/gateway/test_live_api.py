"""The OpenAI SDK against a live gateway: happy paths, streaming, usage, caching per tenant."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.utils.live_gateway import OPERATOR_HEADERS, LiveGateway

MESSAGES = [{"role": "user", "content": "Tell me a story about a cache."}]


def test_chat_non_streaming(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    out = gateway.client(key).chat.completions.create(
        model=gateway.model, messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert out.object == "chat.completion"
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in {"length", "stop"}
    assert out.usage is not None and out.usage.prompt_tokens > 0
    assert 1 <= out.usage.completion_tokens <= 8
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    records = [r for r in gateway.usage.records if r.request_id == out.id]
    assert len(records) == 1 and records[0].status == 200
    assert records[0].completion_tokens == out.usage.completion_tokens


def test_chat_streaming_with_usage(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    chunks = list(
        gateway.client(key).chat.completions.create(
            model=gateway.model,
            messages=MESSAGES,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1]
    assert chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert usage_chunks[0].usage.completion_tokens >= 1
    assert isinstance(text, str)


def test_stream_is_sse_with_done(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    body = {"model": gateway.model, "messages": MESSAGES, "max_tokens": 3, "stream": True}
    with httpx.stream(
        "POST",
        gateway.base_url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as r:
        raw = r.read().decode()
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert '"usage"' not in raw  # no include_usage: no usage field at all


def test_completions_and_n2(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    out = gateway.client(key).completions.create(
        model=gateway.model, prompt="Once upon a time", max_tokens=5, n=2, temperature=1.0, seed=3
    )
    assert out.object == "text_completion"
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert out.usage is not None and out.usage.completion_tokens <= 10


def test_completions_streaming_include_usage(gateway: LiveGateway) -> None:
    key = gateway.tenant("acme")
    chunks = list(
        gateway.client(key).completions.create(
            model=gateway.model,
            prompt=[1, 2, 3, 4],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert sum(1 for c in chunks if c.usage is not None) == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 4


def test_seeded_sampling_is_reproducible(gateway: LiveGateway) -> None:
    client = gateway.client(gateway.tenant("acme"))

    def run() -> list[str]:
        out = client.chat.completions.create(
            model=gateway.model, messages=MESSAGES, max_tokens=10, temperature=1.0, seed=42, n=2
        )
        return [c.message.content or "" for c in out.choices]

    assert run() == run()


def test_stop_string_ends_choice(gateway: LiveGateway) -> None:
    client = gateway.client(gateway.tenant("acme"))
    free = client.completions.create(
        model=gateway.model, prompt="abc", max_tokens=12, temperature=0
    ).choices[0]
    assert len(free.text) >= 2
    stop = free.text[1:3] if free.text[1:3].strip() else free.text[1]
    out = client.completions.create(
        model=gateway.model, prompt="abc", max_tokens=12, temperature=0, stop=[stop]
    ).choices[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert free.text.startswith(out.text)


def test_models_lists_only_allowed(gateway: LiveGateway) -> None:
    open_key = gateway.tenant("acme")
    assert [m.id for m in gateway.client(open_key).models.list().data] == [gateway.model]
    gateway.tenant("narrow", allowed_models=["other-model"])
    narrow_key = gateway.key("narrow")
    assert gateway.client(narrow_key).models.list().data == []


def test_models_retrieve_only_allowed(gateway: LiveGateway) -> None:
    open_key = gateway.tenant("acme")
    card = gateway.client(open_key).models.retrieve(gateway.model)
    assert (card.id, card.object, card.owned_by) == (gateway.model, "model", "cloister")
    gateway.tenant("narrow", allowed_models=["other-model"])
    narrow = gateway.client(gateway.key("narrow"))
    # Not allowed and not served look the same: a key learns nothing of other models.
    for name in (gateway.model, "no-such-model", "org/with-slash", "x" * 5000):
        with pytest.raises(openai.NotFoundError) as caught:
            narrow.models.retrieve(name)
        assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.AuthenticationError):
        gateway.client("sk-clo-wrong").models.retrieve(gateway.model)


def test_prefix_cache_is_per_tenant(gateway: LiveGateway) -> None:
    long_prompt = [{"role": "user", "content": "Summarise the plot of a long novel. " * 8}]
    a = gateway.client(gateway.tenant("tenant-a"))
    b = gateway.client(gateway.tenant("tenant-b"))

    def cached(client: object) -> int:
        out = client.chat.completions.create(  # type: ignore[attr-defined]
            model=gateway.model, messages=long_prompt, max_tokens=2, temperature=0
        )
        return int(out.usage.prompt_tokens_details.cached_tokens)

    assert cached(a) == 0
    assert cached(a) > 0  # the engine's prefix cache must report the hit
    assert cached(b) == 0  # another tenant never hits tenant A's blocks


def test_key_isolation_gives_each_key_its_domain(gateway: LiveGateway) -> None:
    first = gateway.tenant("strict", isolation="key")
    second = gateway.key("strict")
    prompt = [{"role": "user", "content": "Explain paging in operating systems. " * 8}]

    def cached(key: str) -> int:
        out = gateway.client(key).chat.completions.create(
            model=gateway.model, messages=prompt, max_tokens=2, temperature=0
        )
        return int(out.usage.prompt_tokens_details.cached_tokens)

    cached(first)
    assert cached(second) == 0
    assert cached(first) > 0


def test_metrics_exposes_vllm_and_gateway_series(gateway: LiveGateway) -> None:
    client = gateway.client(gateway.tenant("acme"))
    client.chat.completions.create(model=gateway.model, messages=MESSAGES, max_tokens=2)
    text = httpx.get(gateway.base_url + "/metrics", headers=OPERATOR_HEADERS).text
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        'cloister_requests_total{model="tiny",status="200",tenant="acme"} 1.0',
    ):
        assert name in text, name
