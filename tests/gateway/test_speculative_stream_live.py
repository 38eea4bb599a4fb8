"""Speculative decoding behind the gateway (in-process engine, tiny model): a tenant's
greedy text is the text without speculation, fields a tenant sends to steer
speculation change nothing, and a `fixed:4` tenant's stream hides how many tokens
each step accepted while a `token` tenant's shows it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.fronts.async_engine import AsyncEngine
from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.tiny_model import make_tiny_model_dir

PROMPT = "one two three " * 6
MAX_TOKENS = 30
HOSTILE = {
    "num_speculative_tokens": 10**6,
    "speculative_model": "/etc/passwd",
    "speculative_method": "draft",
    "speculative_config": {"method": "eagle", "num_speculative_tokens": -1},
}


def _engine(tmp_path: Path, **options: Any) -> Any:
    return AsyncEngine.from_options(
        model=str(make_tiny_model_dir(tmp_path)),
        max_model_len=512,
        num_blocks=256,
        attention_backend="torch",
        **options,
    )


@pytest.fixture
def spec_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    engine = _engine(tmp_path, speculative_method="ngram", speculative_max_batch=64)
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())
    yield gw
    stop()


def _greedy(gw: LiveGateway, key: str, extra: dict[str, Any], **params: Any) -> Any:
    """A greedy completion of PROMPT, MAX_TOKENS long whatever EOS says; `extra` goes into
    the request body as it is."""
    client: Any = gw.client(key)
    return client.completions.create(
        model=gw.model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, **extra},
        **params,
    )


def _stream(gw: LiveGateway, key: str, **extra: Any) -> list[str]:
    """The streamed content chunks' texts."""
    stream = _greedy(gw, key, extra, stream=True)
    return [c.choices[0].text for c in stream if c.choices and c.choices[0].text]


def _token_texts(gw: LiveGateway, key: str) -> list[str]:
    """Each output token's text, from logprobs (a request with logprobs never speculates;
    greedy, its tokens are the same)."""
    done = _greedy(gw, key, {}, logprobs=0)
    tokens: list[str] = done.choices[0].logprobs.tokens
    assert done.usage.completion_tokens == MAX_TOKENS
    return tokens


def test_cadence_hides_accepted_drafts_and_text_is_unchanged(
    spec_gateway: LiveGateway, tmp_path: Path
) -> None:
    gw = spec_gateway
    paced, plain = gw.tenant("paced"), gw.tenant("plain")
    with gw.sessions() as s:
        store.update_tenant(s, name="paced", stream_cadence="fixed:4")
    tokens = _token_texts(gw, plain)
    plain_chunks = _stream(gw, plain)
    paced_chunks = _stream(gw, paced)
    text = "".join(tokens)
    assert "".join(plain_chunks) == text and "".join(paced_chunks) == text
    # Per event under `token`: steps that accepted drafts show as fewer, longer chunks.
    assert len(plain_chunks) < MAX_TOKENS
    # Under fixed:4 every chunk is the text of exactly 4 tokens, the last of the 2 left.
    expected = ["".join(tokens[i : i + 4]) for i in range(0, MAX_TOKENS, 4)]
    assert paced_chunks == expected
    stats = gw.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens > 0

    # A tenant cannot steer speculation: such fields are ignored, the text is the same.
    assert "".join(_stream(gw, plain, **HOSTILE)) == text
    hostile = _greedy(gw, plain, HOSTILE)
    assert hostile.choices[0].text == text
    assert hostile.usage.completion_tokens == MAX_TOKENS
