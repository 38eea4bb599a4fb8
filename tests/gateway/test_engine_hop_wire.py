"""The completions hop, client and server: both chunk forms, hang-ups, errors.

In one process (fast): an engine server app over the real engine and the fake fast model, served by uvicorn
in a thread, reached by `RemoteEngineClient` (aiohttp) or by a plain HTTP client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from starlette.requests import Request

from engine.errors import EngineDeadError, EngineOverloadedError, InvalidRequestError
from engine.fronts.async_engine import AsyncEngine, RequestStream
from engine.fronts.core_loop import AbortRequest, RequestFailure, StepReport
from engine.outputs import (
    CompletionDelta,
    PositionLogprobs,
    RequestMetrics,
    StreamEvent,
    TokenLogprob,
)
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_hop.wire import (
    WireFormatError,
    event_from_compact,
    event_to_compact,
    request_from_wire,
    sse_chunk,
)
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tests.gateway.engine_servers import serve_in_thread
from tests.utils.byte_tokenizer import ByteTokenizer
from tests.utils.engine_faults import overloaded
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine

TOKEN = "svc-" + "hop-wire-token-for-tests-only"
AUTH = {"authorization": f"Bearer {TOKEN}"}


class ScriptedEngine(AsyncEngine):
    """The real front over the fake fast model (10 ms a step), which records every abort
    the server asks for, refuses a request while `MAX_LIVE` are live (as a full waiting
    queue does), and fails the requests whose prompt starts with `FAIL` after their
    first event.

    Its streams are the front's own (`RequestStream`s); what the engine reports is
    scripted before the front routes it (`_on_report`): every event is stamped with
    metrics, and a `FAIL` request's first event comes with that request's failure, as
    the engine reports a request that failed in a step.
    """

    FAIL = 99
    MAX_LIVE = 4

    def __init__(self) -> None:
        super().__init__(fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS, compute_s=0.01))
        self.abort_calls: list[str] = []
        self.submitted: list[str] = []
        self._arrivals: dict[str, float] = {}  # request id -> when it was submitted
        self._failing: set[str] = set()  # FAIL requests whose first event is to come

    @property
    def running(self) -> set[str]:
        """The ids of the requests the front has not ended yet."""
        return set(self._streams)

    def submit(self, request: EngineRequest) -> RequestStream:
        """The engine's stream; a `FAIL` request's fails after its first event."""
        self.submitted.append(request.request_id)  # refused or not
        if len(self.running) >= self.MAX_LIVE:
            raise overloaded()
        stream = super().submit(request)
        self._arrivals[request.request_id] = time.time()
        if request.prompt_token_ids[0] == self.FAIL:
            self._failing.add(request.request_id)
        return stream

    def _on_report(self, report: StepReport) -> None:
        """Routes `report` with each event stamped with metrics: the engine times a
        request on its last event only; the others get the time so far, as an engine
        timing every step would, so that the hop's carrying them is checked on every
        event. A `FAIL` request's first event is followed by its failure, and the request
        is aborted in the engine (as the engine drops a request that failed)."""
        now = time.time()
        events: list[StreamEvent] = []
        failures = list(report.failures)
        failed: set[str] = set()
        for event in report.events:
            rid = event.request_id
            if rid in failed:
                continue
            arrival = self._arrivals.get(rid, now)
            if event.metrics is None:
                event = dataclasses.replace(
                    event, metrics=RequestMetrics(arrival, arrival, now, None)
                )
            events.append(event)
            if rid in self._failing:
                self._failing.discard(rid)
                failed.add(rid)
                failures.append(RequestFailure(rid, RuntimeError("the device fell over")))
                self._send(AbortRequest(rid, next(self._abort_tokens)))
            if event.finished or rid in failed:
                self._arrivals.pop(rid, None)
        super()._on_report(
            dataclasses.replace(report, events=tuple(events), failures=tuple(failures))
        )

    async def abort(self, request_id: str) -> None:
        """Aborts, then records the call (once the request's blocks are free)."""
        await super().abort(request_id)
        self.abort_calls.append(request_id)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, ScriptedEngine]]:
    engine = ScriptedEngine()
    url, stop = serve_in_thread(
        EngineServer(engine, model_name="tiny", auth=ServiceAuth(TOKEN)).app()
    )
    try:
        yield url, engine
    finally:
        stop()


def request(prompt: tuple[int, ...], max_tokens: int, rid: str) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return EngineRequest(prompt_token_ids=prompt, params=params, request_id=rid)


def client_of(url: str) -> RemoteEngineClient:
    return RemoteEngineClient(
        url, token=TOKEN, tokenizer=ByteTokenizer(), info=fetch_info(url, TOKEN), poll_s=60
    )


async def collect(client: RemoteEngineClient, req: EngineRequest) -> list[StreamEvent]:
    events = []
    async for event in client.submit(req):
        events.append(event)
        if event.finished:
            break
    return events


def test_the_compact_form_carries_the_whole_event() -> None:
    lp = PositionLogprobs(TokenLogprob(1, -0.5, "h"), (TokenLogprob(3, -1.0, "x"),))
    event = StreamEvent(
        request_id="r-1",
        deltas=(CompletionDelta(0, "hé", (1, 2), (lp, lp), None), CompletionDelta(1, "", (), None, "stop")),
        prompt_token_ids=(5, 6, 7),
        num_cached_tokens=16,
        finished=True,
        metrics=RequestMetrics(1.0, 1.1, 1.2, 1.3, 2),
    )  # fmt: skip
    chunk = sse_chunk(event_to_compact(event))
    assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    assert event_from_compact("r-1", orjson.loads(chunk[6:]), (5, 6, 7)) == event
    bare = StreamEvent("r-2", (CompletionDelta(0, "a", (97,), None, None),), (1,), 0, False)
    assert (
        event_from_compact("r-2", orjson.loads(sse_chunk(event_to_compact(bare))[6:]), (1,)) == bare
    )


def test_the_gateway_and_the_in_process_engine_see_the_same_events(
    served: tuple[str, ScriptedEngine],
) -> None:
    url, engine = served
    req = request((10, 11, 12), 5, "same-1")

    async def both() -> tuple[list[StreamEvent], list[StreamEvent]]:
        client = client_of(url)
        try:
            remote = await collect(client, req)
        finally:
            await client.shutdown()
        # The same engine, in this process: a twin of the served one, on this loop.
        twin = ScriptedEngine()
        await twin.start()
        try:
            local = [e async for e in twin.submit(request((10, 11, 12), 5, "same-1"))]
        finally:
            await twin.shutdown()
        return remote, local

    remote, local = asyncio.run(both())
    assert len(remote) == len(local) == 5 and remote[-1].finished
    for r, loc in zip(remote, local, strict=True):  # all but the wall-clock metrics
        assert (r.deltas, r.prompt_token_ids, r.num_cached_tokens, r.finished) == (
            loc.deltas, loc.prompt_token_ids, loc.num_cached_tokens, loc.finished,
        )  # fmt: skip
        assert r.metrics is not None and loc.metrics is not None


def test_a_plain_client_gets_openai_chunks_and_the_gateway_the_compact_ones(
    served: tuple[str, ScriptedEngine],
) -> None:
    url, _ = served
    body = {
        "model": "tiny",
        "prompt": [10, 11, 12],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
    }

    def chunks(headers: dict[str, str]) -> list[dict[str, object]]:
        r = httpx.post(url + "/v1/completions", json=body, headers={**AUTH, **headers}, timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln[6:] for ln in r.text.split("\n\n") if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(ln) for ln in lines[:-1]]

    openai_chunks = chunks({})
    compact = chunks({"x-cloister-wire": "events"})
    assert all(c["object"] == "text_completion" and "cloister" in c for c in openai_chunks)
    assert all(set(c) == {"d", "c", "f", "m"} for c in compact)
    openai_text = "".join(ch["text"] for c in openai_chunks for ch in c["choices"])  # type: ignore[attr-defined]
    assert openai_text == "".join(d[1] for c in compact for d in c["d"])  # type: ignore[attr-defined]
    assert openai_chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    whole = httpx.post(url + "/v1/completions", json={**body, "stream": False}, headers=AUTH)
    assert whole.json()["choices"][0]["text"] == openai_text
    assert whole.json()["usage"]["completion_tokens"] == 4


def test_closing_a_stream_hangs_up_and_the_server_aborts_the_request(
    served: tuple[str, ScriptedEngine],
) -> None:
    url, engine = served

    async def hang_up() -> None:
        client = client_of(url)
        try:
            stream = client.submit(request((20, 21), 400, "hang-up-1"))
            first = await stream.__anext__()
            assert not first.finished and "hang-up-1" in engine.running
            await stream.aclose()  # type: ignore[attr-defined]
            deadline = time.monotonic() + 5
            while "hang-up-1" not in engine.abort_calls and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            await client.shutdown()

    asyncio.run(hang_up())
    assert engine.abort_calls.count("hang-up-1") == 1  # the server's, not the client's call
    assert "hang-up-1" not in engine.running  # 400 tokens at 10 ms would take 4 s


def test_errors_map_to_the_engine_clients_exceptions(served: tuple[str, ScriptedEngine]) -> None:
    url, engine = served

    async def errors() -> None:
        client = client_of(url)
        try:
            with pytest.raises(InvalidRequestError) as bad:  # a 400: over the context length
                await collect(client, request((1,) * 600, 4, "too-long-1"))
            assert bad.value.code == "context_length_exceeded"
            with pytest.raises(EngineDeadError, match="the device fell over"):  # in-band
                await collect(client, request((ScriptedEngine.FAIL, 1), 8, "fails-1"))
            held = [client.submit(request((30, i), 400, f"hold-{i}")) for i in range(4)]
            for stream in held:
                await stream.__anext__()
            with pytest.raises(EngineOverloadedError) as full:  # a 503 with retry-after
                await collect(client, request((31,), 4, "full-1"))
            assert full.value.retry_after_s == 2.0
            for stream in held:
                await stream.aclose()  # type: ignore[attr-defined]
        finally:
            await client.shutdown()
        shut = client_of(url)
        await shut.shutdown()
        with pytest.raises(EngineDeadError):
            shut.submit(request((1,), 1, "after-shutdown"))

    asyncio.run(errors())
    whole = httpx.post(
        url + "/v1/completions",
        json={"model": "tiny", "prompt": [ScriptedEngine.FAIL, 2], "max_tokens": 4},
        headers=AUTH,
    )
    assert whole.status_code == 503 and "the device fell over" in whole.json()["error"]["message"]


@pytest.mark.parametrize("prompt", [[1, "two"], [1, 2.5], [True, 2], [[1], 2]])
def test_a_prompt_of_anything_but_token_ids_is_a_400(
    served: tuple[str, ScriptedEngine], prompt: list[object]
) -> None:
    url, engine = served
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "stream": True}
    r = httpx.post(url + "/v1/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    assert "token ids" in r.json()["error"]["message"]


def test_a_streamed_request_reaches_the_engine_when_its_response_is_sent() -> None:
    """The route returns before it submits (the engine's first step would otherwise
    contend with the route's own work); the response submits, and a refusal found
    then is still an error status, not a stream."""
    engine = ScriptedEngine()
    server = EngineServer(engine, model_name="tiny", auth=ServiceAuth(TOKEN))

    def scope_of(rid: str) -> dict[str, object]:
        headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"x-request-id", rid.encode())]
        return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}

    async def send_request(rid: str, prompt: list[int]) -> list[dict[str, object]]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, "stream": True}
        inbox = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]

        async def receive() -> dict[str, object]:
            if inbox:
                return inbox.pop(0)
            await asyncio.Event().wait()  # the client stays: no disconnect
            raise AssertionError("unreachable")

        sent: list[dict[str, object]] = []

        async def send(message: dict[str, object]) -> None:
            sent.append(message)

        scope = scope_of(rid)
        response = await server.completions(Request(scope, receive))
        assert rid not in engine.submitted  # not yet: the route only built the response
        await response(scope, receive, send)
        assert rid in engine.submitted
        return sent

    async def scenario() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
        await engine.start()
        try:
            ok = await send_request("late-1", [20, 21])
            refused = await send_request("late-2", [1] * 600)  # over the context length
        finally:
            await engine.shutdown()
        return ok, refused

    ok, refused = asyncio.run(scenario())
    assert ok[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in ok[1:])  # type: ignore[misc]
    assert body.endswith(b"data: [DONE]\n\n") and body.count(b"data: {") == 3
    assert refused[0]["status"] == 400
    error = orjson.loads(refused[1]["body"])["error"]  # type: ignore[arg-type]
    assert error["type"] == "invalid_request_error" and "late-2" not in engine.running


def test_an_unreachable_server_is_an_unavailable_engine(served: tuple[str, ScriptedEngine]) -> None:
    url, _ = served

    async def unreachable() -> None:
        client = RemoteEngineClient(  # nothing listens on port 1
            "http://127.0.0.1:1",
            token=TOKEN,
            tokenizer=ByteTokenizer(),
            info=fetch_info(url, TOKEN),
        )
        try:
            with pytest.raises(EngineDeadError, match="engine server"):
                await collect(client, request((1, 2), 2, "nowhere-1"))
        finally:
            await client.shutdown()

    asyncio.run(unreachable())


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("ab", ("ab",)), (["ab", "c"], ("ab", "c")), (None, ()), ([], ())],
)
def test_a_stop_string_is_one_stop_not_its_characters(
    stop: object, expected: tuple[str, ...]
) -> None:
    """OpenAI's `stop` may be one string; split into characters, "ab" would stop at
    any "a" or "b" for a plain client of the engine server."""
    request = request_from_wire({"prompt": [1, 2], "stop": stop}, {})
    assert request.params.stop == expected


@pytest.mark.parametrize("stop", [5, ["a", 5], {"a": 1}])
def test_a_malformed_stop_is_a_wire_format_error_naming_it(stop: object) -> None:
    with pytest.raises(WireFormatError) as caught:
        request_from_wire({"prompt": [1, 2], "stop": stop}, {})
    assert caught.value.param == "stop"
