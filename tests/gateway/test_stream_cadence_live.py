"""A tenant's stream cadence over HTTP, with the openai SDK against a live gateway.

With the real in-process engine (tiny model, one token per step): a `fixed:4` tenant's
streamed chunks carry exactly 4 tokens each (counted by their logprobs) but the last;
a `token` tenant's carry one each, as before; text, usage and finish reasons are the
same for both. With an engine that emits several tokens per step (as speculative
decoding does), the `token` tenant sees the step sizes and the `fixed:4` tenant does not.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.fronts.async_engine import AsyncEngine
from engine.outputs import CompletionDelta, PositionLogprobs, StreamEvent, TokenLogprob
from engine.request import EngineRequest
from tenancy import store
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.byte_tokenizer import ByteTokenizer
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine
from tests.utils.live_gateway import (
    LiveGateway,
    assert_aborted_and_metered_once,
    leave_stream_early,
    make_test_engine,
    start_gateway,
)

MESSAGES = [{"role": "user", "content": "Say something about side channels."}]
MAX_TOKENS = 18  # 4 + 4 + 4 + 4 + 2 under fixed:4


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """The real engine, with tenants `paced` (fixed:4) and `plain` (token)."""
    gw, stop = start_gateway(tmp_path, engine=make_test_engine(tmp_path), limiter=MemoryLimiter())
    yield gw
    stop()


def _tenants(gw: LiveGateway) -> tuple[str, str]:
    paced, plain = gw.tenant("paced"), gw.tenant("plain")
    with gw.sessions() as s:
        store.update_tenant(s, name="paced", stream_cadence="fixed:4")
    return paced, plain


def _chat_stream(gw: LiveGateway, key: str, **extra: Any) -> list[Any]:
    client: Any = gw.client(key)  # the SDK's overloads do not take extra_body's fields
    stream = client.chat.completions.create(
        model=gw.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, **extra},
    )
    return list(stream)


def _token_counts(chunks: list[Any]) -> list[int]:
    """Tokens per content chunk (each token has one logprobs entry)."""
    return [
        len(c.choices[0].logprobs.content)
        for c in chunks
        if c.choices and c.choices[0].logprobs is not None
    ]


def _text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_fixed_cadence_chunks_hold_exactly_n_tokens_over_chat(gateway: LiveGateway) -> None:
    paced, plain = _tenants(gateway)
    paced_chunks = _chat_stream(gateway, paced)
    plain_chunks = _chat_stream(gateway, plain)
    assert _token_counts(paced_chunks) == [4, 4, 4, 4, 2]
    assert _token_counts(plain_chunks) == [1] * MAX_TOKENS  # the engine's step, as before
    # The same text, usage and ending either way; logprobs in the same order.
    assert _text(paced_chunks) == _text(plain_chunks)
    assert paced_chunks[-1].usage == plain_chunks[-1].usage
    assert paced_chunks[-1].usage.completion_tokens == MAX_TOKENS
    reasons = [c.choices[0].finish_reason for c in paced_chunks if c.choices]
    assert reasons.count("length") == 1 and reasons[-1] == "length"

    def tokens(chunks: list[Any]) -> list[str]:
        return [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in
                c.choices[0].logprobs.content]  # fmt: skip

    assert tokens(paced_chunks) == tokens(plain_chunks)
    # Each paced chunk's text is the text of exactly its own tokens (the engine's tokens
    # decode in isolation to the logprob texts; the chunk carries what they release).
    plain_client: Any = gateway.client(plain)
    full = plain_client.chat.completions.create(
        model=gateway.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert full.choices[0].message.content == _text(paced_chunks)
    # Usage was recorded once per request, the same for both tenants.
    records = gateway.usage.records
    assert [r.completion_tokens for r in records[:2]] == [MAX_TOKENS, MAX_TOKENS]


def test_fixed_cadence_over_completions_and_a_policy_change_applies(
    gateway: LiveGateway,
) -> None:
    paced, _ = _tenants(gateway)
    stream = gateway.client(paced).completions.create(
        model=gateway.model,
        prompt="Once upon a time",
        max_tokens=10,
        temperature=0,
        logprobs=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    counts = [len(c.choices[0].logprobs.tokens or []) for c in stream if c.choices[0].logprobs]
    assert counts == [4, 4, 2]
    # Back to "token": the next request streams per step again (refresh_s 0 here).
    with gateway.sessions() as s:
        store.update_tenant(s, name="paced", stream_cadence="token")
    assert _token_counts(_chat_stream(gateway, paced)) == [1] * MAX_TOKENS


def test_fixed_cadence_over_the_responses_api(gateway: LiveGateway) -> None:
    """The Responses API streams through the same path: its text deltas come per 4
    tokens (5 deltas for 18 tokens, one of them maybe empty and so not sent)."""
    paced, plain = _tenants(gateway)

    def deltas(key: str) -> list[str]:
        body = {
            "model": gateway.model,
            "input": "Say something.",
            "max_output_tokens": MAX_TOKENS,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {key}"}
        out: list[str] = []
        with httpx.stream(
            "POST", gateway.base_url + "/v1/responses", json=body, headers=headers, timeout=60
        ) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event.get("type") == "response.output_text.delta":
                        out.append(event["delta"])
        return out

    paced_deltas, plain_deltas = deltas(paced), deltas(plain)
    assert "".join(paced_deltas) == "".join(plain_deltas)
    assert len(paced_deltas) <= 5 < len(plain_deltas)


# An engine that emits several tokens per step, as speculative decoding does: the step
# sizes cycle through BURSTS; text from the engine's own detokenizer, one byte a token.
BURSTS = (1, 5, 2, 7, 3)
REPLY = "Steps of uneven size: ok. é→ done!"


class BurstEngine(AsyncEngine):
    """The real front over the fake fast model, whose streams are scripted: REPLY (byte
    tokens, logprobs when asked) in steps of BURSTS tokens.

    A request is validated, queued and counted by the real front as usual; its stream
    is replaced by the bursts, and the engine's own request is aborted once they end.
    The gateway tokenizes bytes (`tokenizer`), as the bursts' detokenizer decodes them.
    """

    def __init__(self) -> None:
        super().__init__(fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS))
        self.tokenizer = ByteTokenizer()  # type: ignore[assignment]

    def submit(self, request: EngineRequest) -> Any:
        """The burst stream (the real front's checks and bookkeeping first)."""
        super().submit(request)
        return self._bursts(request)

    async def _bursts(self, request: EngineRequest) -> AsyncIterator[StreamEvent]:
        ids = list(REPLY.encode())
        detok = IncrementalDetokenizer(
            _Decode(self.tokenizer),
            prompt_token_ids=request.prompt_token_ids,
            skip_special_tokens=True,
            stop=request.params.stop,
        )
        at, step = 0, 0
        try:
            while at < len(ids):
                size = BURSTS[step % len(BURSTS)]
                step_ids = ids[at : at + size]
                at, step = at + size, step + 1
                last = at >= len(ids)
                text = "".join(detok.push([t]) for t in step_ids)
                if last:
                    text += detok.flush()
                lps = None
                if request.params.logprobs is not None:
                    lps = tuple(
                        PositionLogprobs(TokenLogprob(t, -0.1, bytes([t]).decode(errors="replace")))
                        for t in step_ids
                    )
                delta = CompletionDelta(0, text, tuple(step_ids), lps, "stop" if last else None)
                yield StreamEvent(request.request_id, (delta,), request.prompt_token_ids, 0, last)
        finally:
            await self.abort(request.request_id)


class _Decode:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(list(ids)))


@pytest.fixture
def burst_gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """A gateway over BurstEngine."""
    gw, stop = start_gateway(tmp_path, engine=BurstEngine(), limiter=MemoryLimiter())
    yield gw
    stop()


def test_step_sizes_show_per_token_and_not_under_a_fixed_cadence(
    burst_gateway: LiveGateway,
) -> None:
    paced, plain = _tenants(burst_gateway)
    plain_chunks = _chat_stream(burst_gateway, plain)
    paced_chunks = _chat_stream(burst_gateway, paced)
    total = len(REPLY.encode())
    sizes = [BURSTS[i % len(BURSTS)] for i in range(total)]
    steps: list[int] = []
    while sum(steps) < total:
        steps.append(min(sizes[len(steps)], total - sum(steps)))
    assert _token_counts(plain_chunks) == steps  # the side channel, as it is per token
    assert _token_counts(paced_chunks) == [4] * (total // 4) + ([total % 4] if total % 4 else [])
    assert _text(paced_chunks) == _text(plain_chunks) == REPLY
    assert paced_chunks[-1].usage == plain_chunks[-1].usage
    assert paced_chunks[-1].usage.completion_tokens == total
    # Each chunk's text is its own tokens' text, as the engine releases it: a multi-byte
    # character goes out with the chunk that holds its last byte.
    detok = IncrementalDetokenizer(
        _Decode(burst_gateway.engine.tokenizer), prompt_token_ids=[], skip_special_tokens=True,
        stop=(),
    )  # fmt: skip
    ids = list(REPLY.encode())
    expected = ["".join(detok.push([t]) for t in ids[i : i + 4]) for i in range(0, total, 4)]
    expected[-1] += detok.flush()
    got = [c.choices[0].delta.content for c in paced_chunks if c.choices and c.choices[0].logprobs]
    assert got == expected
    assert any(len(e.encode()) != 4 for e in expected)  # a character did straddle chunks


def test_a_paced_stream_left_mid_way_aborts_and_meters_once(gateway: LiveGateway) -> None:
    """The chunker sits between the engine and the client: a client that leaves still
    aborts the engine request at once and is metered once, with the tokens it cost."""
    paced, _ = _tenants(gateway)
    client: Any = gateway.client(paced)
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=400, stream=True, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert_aborted_and_metered_once(gateway, leave_stream_early(stream), max_tokens=400)


def test_each_of_n_choices_is_paced_apart(gateway: LiveGateway) -> None:
    paced, _ = _tenants(gateway)
    chunks = _chat_stream(gateway, paced, n=2, temperature=1.0, seed=7)
    for index in (0, 1):
        counts = [
            len(c.choices[0].logprobs.content)
            for c in chunks
            if c.choices and c.choices[0].index == index and c.choices[0].logprobs
        ]
        assert counts == [4, 4, 4, 4, 2], (index, counts)
    assert chunks[-1].usage.completion_tokens == 2 * MAX_TOKENS
