"""A tenant's large prompt never stalls another tenant: size-checked, then tokenized off the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.tokenize import INLINE_CHARS, PER_TENANT_RUNNING, PER_TENANT_WAITING, PromptTokenizer
from tenancy.errors import RateLimitedError
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.byte_tokenizer import ByteTokenizer
from tests.utils.fast_fake_model import gateway_test_engine
from tests.utils.live_gateway import LiveGateway, start_gateway

# Over the inline threshold, well inside the size bound (512 tokens x 64 characters).
LARGE = "y" * (INLINE_CHARS + 1000)
LARGE_B = "b" * len(LARGE)  # as large, but encoded at once


class GatedTokenizer(ByteTokenizer):
    """Encoding a large "y..." text blocks (as a slow Rust encode would) until `release`."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.large_calls = 0

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """The fake template; blocks on conversations of more than 64 messages."""
        if len(messages) > 64:
            self.started.set()
            assert self.release.wait(timeout=20), "never released"
        return super().apply_chat_template(messages, add_generation_prompt)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Bytes of `text`; blocks on large texts."""
        if len(text) > INLINE_CHARS and "y" * 100 in text:
            self.large_calls += 1
            self.started.set()
            assert self.release.wait(timeout=60), "never released"
        return super().encode(text[:100], add_special_tokens)


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[LiveGateway, GatedTokenizer]]:
    engine = gateway_test_engine()
    tokenizer = GatedTokenizer()
    engine.tokenizer = tokenizer  # what the gateway tokenizes with; the engine keeps its own
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    yield gw, tokenizer
    tokenizer.release.set()
    stop()


def _post(gw: LiveGateway, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        gw.base_url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


def test_small_request_of_another_tenant_finishes_while_a_large_prompt_tokenizes(
    gated: tuple[LiveGateway, GatedTokenizer],
) -> None:
    gw, tokenizer = gated
    bomb_key, other_key = gw.tenant("bomber"), gw.tenant("bystander")
    done: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        bomb = pool.submit(
            lambda: _post(
                gw,
                bomb_key,
                "/v1/chat/completions",
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": LARGE}],
                    "max_tokens": 2,
                },
            )
        )
        assert tokenizer.started.wait(timeout=30)
        # The large prompt is inside the tokenizer now. Before the fix it held the event
        # loop there, so this request could not even be read until the release below.
        try:
            small = httpx.post(
                gw.base_url + "/v1/completions",
                json={"model": "tiny", "prompt": "hi", "max_tokens": 2},
                headers={"Authorization": f"Bearer {other_key}"},
                timeout=20,  # generous: it needs milliseconds; a stalled loop never answers
            )
            done.append(f"small:{small.status_code}")
        except httpx.TimeoutException:
            done.append("small:timeout")
        finally:
            assert not bomb.done()
            tokenizer.release.set()
        done.append(f"bomb:{bomb.result().status_code}")
    assert done == ["small:200", "bomb:200"]


def test_prompt_too_long_for_the_context_is_refused_before_tokenizing(
    gated: tuple[LiveGateway, GatedTokenizer],
) -> None:
    gw, tokenizer = gated
    key = gw.tenant("bomber")
    seven_mb = "z" * (7 * 1024 * 1024)
    for path, body in [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": seven_mb}]}),
        ("/v1/completions", {"prompt": seven_mb}),
        ("/v1/completions", {"prompt": ["ok", seven_mb]}),
    ]:
        r = _post(gw, key, path, {"model": "tiny", **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "context_length_exceeded"
    assert tokenizer.large_calls == 0
    r = _post(gw, key, "/v1/completions", {"model": "tiny", "prompt": [65] * 10**6})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


class _Engine:
    """Just what PromptTokenizer reads from an engine client."""

    max_model_len = 4096

    def __init__(self, tokenizer: GatedTokenizer) -> None:
        self.tokenizer = tokenizer


def test_one_tenant_holds_one_worker_and_a_bounded_queue() -> None:
    tokenizer = GatedTokenizer()
    prompts = PromptTokenizer(_Engine(tokenizer))  # type: ignore[arg-type]

    async def scenario() -> None:
        flood = [
            asyncio.create_task(prompts.encode("ten_a", LARGE))
            for _ in range(PER_TENANT_RUNNING + PER_TENANT_WAITING)
        ]
        await asyncio.sleep(0)
        with pytest.raises(RateLimitedError) as refused:
            await prompts.encode("ten_a", LARGE)
        assert refused.value.reason == "concurrency"
        await asyncio.to_thread(tokenizer.started.wait, 30)
        # Tenant A's first prompt blocks one worker; its others wait for A's own slot,
        # so tenant B's large prompt gets the second worker and is done meanwhile.
        assert await asyncio.wait_for(prompts.encode("ten_b", LARGE_B), timeout=30) == [98] * 100
        assert tokenizer.large_calls == 1
        tokenizer.release.set()
        results = await asyncio.gather(*flood)
        assert len(results) == PER_TENANT_RUNNING + PER_TENANT_WAITING
        assert tokenizer.large_calls == len(flood)

    try:
        asyncio.run(scenario())
    finally:
        tokenizer.release.set()
        prompts.close()


def test_many_short_messages_are_rendered_off_the_loop() -> None:
    tokenizer = GatedTokenizer()
    prompts = PromptTokenizer(_Engine(tokenizer))  # type: ignore[arg-type]
    messages = [{"role": "user", "content": ""} for _ in range(1000)]

    async def scenario() -> None:
        task = asyncio.create_task(prompts.encode_chat("ten_a", messages))
        # Inline, the template would block this loop and this wait would never start.
        assert await asyncio.to_thread(tokenizer.started.wait, 10)
        assert not task.done()
        tokenizer.release.set()
        assert await task

    try:
        asyncio.run(scenario())
    finally:
        tokenizer.release.set()
        prompts.close()
