"""The link over the engine's own front: a real `AsyncEngine` (the fast fake model)
behind the engine server. Its streams hand each event to the link within the engine's
step report (`RequestStream.listen`), with no task per request; these tests hold that
path to the same events, aborts and failures as HTTP's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from engine.errors import EngineDeadError
from engine.fronts.async_engine import AsyncEngine, RequestStream
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_server import link as link_module
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tests.gateway.engine_servers import serve_in_thread
from tests.gateway.test_engine_hop_wire import TOKEN
from tests.gateway.test_engine_link import until
from tests.utils.fast_fake_model import fast_fake_engine

AUTH = {"authorization": f"Bearer {TOKEN}"}
STEP_S = 0.005  # 400 tokens take two seconds: long enough to stop one mid-stream


@dataclass
class Served:
    engine: AsyncEngine
    server: EngineServer
    url: str


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    engine = fast_fake_engine(num_blocks=64, max_model_len=512, compute_s=STEP_S)
    server = EngineServer(engine, model_name="fast-fake", auth=ServiceAuth(TOKEN))
    url, stop = serve_in_thread(server.app())
    try:
        yield Served(engine, server, url)
    finally:
        stop()


def client_of(served: Served, transport: str = "link") -> RemoteEngineClient:
    return RemoteEngineClient(
        served.url,
        token=TOKEN,
        tokenizer=served.engine.tokenizer,
        info=fetch_info(served.url, TOKEN),
        poll_s=60,
        transport=transport,  # type: ignore[arg-type]
    )


def request(prompt: tuple[int, ...], max_tokens: int, rid: str) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(prompt_token_ids=prompt, params=params, request_id=rid)


async def collect(client: RemoteEngineClient, req: EngineRequest) -> list[StreamEvent]:
    return [event async for event in client.submit(req)]


def outputs(events: list[StreamEvent]) -> tuple[Any, ...]:
    """Tokens, text and the end, of one request's events."""
    tokens = tuple(t for e in events for d in e.deltas for t in d.token_ids)
    text = "".join(d.text for e in events for d in e.deltas)
    return tokens, text, events[-1].finished, events[-1].prompt_token_ids


def idle(served: Served) -> bool:
    stats = served.engine.stats()
    return stats.num_running == 0 and stats.num_waiting == 0 and stats.kv_cache_usage == 0


def test_listened_link_streams_carry_what_http_carries(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    listened: list[str] = []
    listen = RequestStream.listen

    def spy(stream: RequestStream, listener: Any) -> None:
        listened.append(stream.request_id)
        listen(stream, listener)

    monkeypatch.setattr(RequestStream, "listen", spy)
    prompts = [(10 + i, 20 + i, 30 + i) for i in range(4)]

    async def both() -> tuple[list[Any], list[Any]]:
        link, http = client_of(served), client_of(served, "http")
        try:
            over_link = await asyncio.gather(
                *(collect(link, request(p, 6, f"listen-{i}")) for i, p in enumerate(prompts))
            )
            over_http = await asyncio.gather(
                *(collect(http, request(p, 6, f"http-{i}")) for i, p in enumerate(prompts))
            )
            return [outputs(e) for e in over_link], [outputs(e) for e in over_http]
        finally:
            await link.shutdown()
            await http.shutdown()

    over_link, over_http = asyncio.run(both())
    assert sorted(listened) == [f"listen-{i}" for i in range(4)]  # no task per request
    assert over_link == over_http
    assert all(len(tokens) == 6 and finished for tokens, _, finished, _ in over_link)
    assert [prompt for *_, prompt in over_link] == prompts
    assert served.server.link.in_flight() == 0


def test_an_abort_frame_and_a_hang_up_free_the_engines_blocks(served: Served) -> None:
    generated = served.engine.stats().num_generated_tokens

    async def stop_them() -> tuple[int, int]:
        client = client_of(served)
        try:
            stream = client.submit(request((40, 41), 400, "stopped-1"))
            first = await stream.__anext__()
            await client.abort("stopped-1")
            await until(lambda: idle(served))
            async with aiohttp.ClientSession() as session:
                ws = await session.ws_connect(served.url + "/internal/link", headers=AUTH)
                body = {"model": "fast-fake", "prompt": [42], "max_tokens": 400, "stream": True}
                await ws.send_bytes(orjson.dumps({"op": "submit", "id": "hung-up", "body": body}))
                frame = orjson.loads((await ws.receive()).data)
                await ws.close()
            await until(lambda: idle(served))
            return len(first.deltas[0].token_ids), len(frame["e"])
        finally:
            await client.shutdown()

    first_tokens, _ = asyncio.run(stop_them())
    assert first_tokens >= 1
    assert served.server.link.in_flight() == 0
    assert idle(served)  # blocks freed
    # Both stopped long before their 400 tokens each.
    assert served.engine.stats().num_generated_tokens - generated < 400


@pytest.mark.parametrize("poison", ["raises", "not-json"])
def test_an_event_that_cannot_be_sent_ends_its_own_stream_alone(
    served: Served, monkeypatch: pytest.MonkeyPatch, poison: str
) -> None:
    encode = link_module.event_to_compact

    def poisoned(event: StreamEvent) -> Any:
        if event.request_id == "poison":
            if poison == "raises":
                raise ValueError("cannot encode")
            return {"d": {1, 2}}  # a set: orjson cannot write it, in this step's batch
        return encode(event)

    monkeypatch.setattr(link_module, "event_to_compact", poisoned)

    async def scenario() -> tuple[list[StreamEvent], BaseException]:
        client = client_of(served)
        try:
            results = await asyncio.gather(
                collect(client, request((50, 51), 300, "poison")),
                collect(client, request((52, 53), 8, "healthy")),
                return_exceptions=True,
            )
            await until(lambda: idle(served))
        finally:
            await client.shutdown()
        failed, healthy = results
        assert isinstance(healthy, list) and isinstance(failed, BaseException)
        return healthy, failed

    healthy, failed = asyncio.run(scenario())
    assert isinstance(failed, EngineDeadError) and "could not send" in str(failed)
    assert healthy[-1].finished and sum(len(d.token_ids) for e in healthy for d in e.deltas) == 8
    assert idle(served) and served.server.link.in_flight() == 0  # the poisoned one aborted


def test_the_events_of_one_engine_step_go_in_one_frame(served: Served) -> None:
    async def frames() -> list[Any]:
        got: list[Any] = []
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(served.url + "/internal/link", headers=AUTH)
            for i in range(4):
                body = {"model": "fast-fake", "prompt": [50 + i], "max_tokens": 6, "stream": True}
                await ws.send_bytes(orjson.dumps({"op": "submit", "id": f"step-{i}", "body": body}))
            finished = 0
            while finished < 4:
                frame = orjson.loads((await asyncio.wait_for(ws.receive(), 30)).data)
                got.append(frame)
                messages = frame if isinstance(frame, list) else [frame]
                finished += sum(1 for m in messages if m["e"]["f"])
            await ws.close()
        return got

    got = asyncio.run(frames())
    batches = [f for f in got if isinstance(f, list)]
    # Once the four decode together, each step's four events leave in one frame.
    assert batches and max(len(b) for b in batches) == 4
    assert all(len({m["id"] for m in b}) == len(b) for b in batches)  # one event a request
    messages = [m for f in got for m in (f if isinstance(f, list) else [f])]
    for i in range(4):
        events = [m["e"] for m in messages if m["id"] == f"step-{i}"]
        assert sum(len(d[2]) for e in events for d in e["d"]) == 6
        assert [e["f"] for e in events] == [False] * (len(events) - 1) + [True]
    assert served.server.link.in_flight() == 0
