"""The gateway over an engine in a child process (`engine_mode = "process"`).

The same OpenAI SDK calls as over the in-process engine: streaming, usage, per-tenant
prefix caching through the process boundary, bad input answered with a 4xx while the
engine keeps serving, and the child's counters on /metrics.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from assembly.engines import load_engine
from engine.fronts.process_engine import ProcessEngine
from server.settings import Settings
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import OPERATOR_HEADERS, LiveGateway, start_gateway, stream_chat
from tests.utils.tiny_model import make_tiny_model_dir

MESSAGES = [{"role": "user", "content": "Say something about caches. " * 6}]


def process_engine(tmp: Path, *, num_blocks: int) -> ProcessEngine:
    """The tiny model's engine in a child process, built the way `cloister serve` builds it."""
    settings = Settings(
        data_dir=tmp,
        model=str(make_tiny_model_dir(tmp)),
        engine_mode="process",
        attention_backend="torch",
        max_model_len=512,
        log_level="WARNING",
    )
    engine = load_engine(settings, num_blocks=num_blocks)
    assert isinstance(engine, ProcessEngine) and engine.pid is not None
    return engine


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """One live gateway whose engine loop runs in a child process."""
    tmp = tmp_path_factory.mktemp("process-engine")
    engine = process_engine(tmp, num_blocks=256)
    gw, stop = start_gateway(tmp, engine=engine, limiter=MemoryLimiter())
    yield gw
    stop()


def test_chat_and_stream_through_the_engine_process(gateway: LiveGateway) -> None:
    client = gateway.client(gateway.tenant("acme"))
    out = client.chat.completions.create(
        model=gateway.model, messages=MESSAGES, max_tokens=5, temperature=0, seed=1
    )
    assert out.choices[0].finish_reason in {"stop", "length"}
    assert out.usage is not None and out.usage.completion_tokens >= 1

    chunks, text = stream_chat(client, MESSAGES, max_tokens=5, model=gateway.model, seed=1)
    assert text == out.choices[0].message.content  # greedy: the same answer either way
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == out.usage.completion_tokens


def test_prefix_cache_stays_per_tenant_across_the_process_boundary(
    gateway: LiveGateway,
) -> None:
    a = gateway.client(gateway.tenant("tenant-a"))
    b = gateway.client(gateway.tenant("tenant-b"))
    prompt = [{"role": "user", "content": "Explain virtual memory in detail. " * 8}]

    def cached(client: openai.OpenAI) -> int:
        out = client.chat.completions.create(
            model=gateway.model, messages=prompt, max_tokens=2, temperature=0
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return int(out.usage.prompt_tokens_details.cached_tokens or 0)

    assert cached(a) == 0
    assert cached(a) > 0
    assert cached(b) == 0


def test_bad_input_is_a_4xx_and_the_engine_keeps_serving(gateway: LiveGateway) -> None:
    client = gateway.client(gateway.tenant("careless"))
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=gateway.model, prompt="word " * 2000, max_tokens=4)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=gateway.model, prompt="hi", max_tokens=4, n=10_000)
    out = client.completions.create(model=gateway.model, prompt="hi", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens >= 1

    metrics = httpx.get(gateway.base_url + "/metrics", headers=OPERATOR_HEADERS).text
    queries = [
        line for line in metrics.splitlines() if line.startswith("vllm:prefix_cache_queries")
    ]
    assert queries and float(queries[0].split()[-1]) > 0  # counters come from the child


def test_a_dead_engine_process_is_a_503_and_fails_health(tmp_path: Path) -> None:
    engine = process_engine(tmp_path, num_blocks=64)
    assert engine.pid is not None
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    try:
        client = gw.client(gw.tenant("acme"))
        assert httpx.get(gw.base_url + "/health").status_code == 200
        client.completions.create(model=gw.model, prompt="hi", max_tokens=2)

        os.kill(engine.pid, signal.SIGKILL)
        engine._process.join(30)
        deadline = time.monotonic() + 10  # the loop notices the closed socket
        while engine.alive and time.monotonic() < deadline:
            time.sleep(0.05)

        health = httpx.get(gw.base_url + "/health")
        assert health.status_code == 503
        assert health.json() == {"status": "engine_unavailable"}
        with pytest.raises(openai.InternalServerError) as dead:
            client.completions.create(model=gw.model, prompt="hi", max_tokens=2)
        assert dead.value.status_code == 503
        assert dead.value.code == "engine_unavailable"
        assert gw.usage.records[-1].status == 503  # refused requests are still metered
    finally:
        stop()
