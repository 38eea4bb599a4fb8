"""The engine as its own server: `cloister engine serve`, the remote client, the credential.

One engine process (tiny model) for the module; a gateway in this process reaches it
through `RemoteEngineClient`, as a split deployment does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.kv_cache.cache_rules import CacheRules, DomainRule
from engine.model.tokenizer import load_tokenizer
from engine.outputs import (
    CompletionDelta,
    PositionLogprobs,
    RequestMetrics,
    StreamEvent,
    TokenLogprob,
)
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured.spec import StructuredSpec
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_hop.wire import (
    event_from_wire,
    event_to_wire,
    request_from_wire,
    request_to_wire,
    rules_from_wire,
    rules_to_wire,
)
from tests.gateway.engine_servers import (
    ENGINE_COMMAND,
    SERVICE_TOKEN,
    EngineProcess,
    engine_env,
    engine_servers,
    gateway_over,
    spawn_engine,
    wait_ready,
)
from tests.utils.live_gateway import LiveGateway, stream_chat
from tests.utils.services import free_port
from tests.utils.tiny_model import make_tiny_model_dir

MESSAGES = [{"role": "user", "content": "Tell me a story about a cache, at length."}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    with engine_servers(model_dir, tmp_path_factory.mktemp("logs"), 1) as (one,):
        yield one


@pytest.fixture(scope="module")
def remote_gateway(
    engine: EngineProcess, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    tokenizer = load_tokenizer(model_dir)

    def client() -> RemoteEngineClient:
        info = fetch_info(engine.base_url, SERVICE_TOKEN)
        return RemoteEngineClient(
            engine.base_url, token=SERVICE_TOKEN, tokenizer=tokenizer, info=info, poll_s=0.2
        )

    with gateway_over(tmp_path_factory.mktemp("gw"), client) as gw:
        yield gw


def test_the_request_object_survives_the_hop() -> None:
    request = EngineRequest(
        prompt_token_ids=(5, 6, 7),
        params=SamplingParams(
            n=2, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, seed=3, max_tokens=9,
            min_tokens=1, stop=("x",), stop_token_ids=(4,), logprobs=2, logit_bias={9: -5.0},
            repetition_penalty=1.1, structured=StructuredSpec("regex", "[a-z]+"),
        ),
        request_id="r-1", cache_domain="t:a/k:b", fairness_key="t:a", weight=2.5,
        adapter="lora-x", cache=False, priority=-3, prompt="hi", traffic_class="batch",
    )  # fmt: skip
    body, headers = request_to_wire(request, "tiny")
    assert body["cache_salt"] == "t:a/k:b" and headers["x-llm-d-inference-fairness-id"] == "t:a"
    assert request_from_wire(body, headers) == request
    event = StreamEvent(
        request_id="r-1",
        deltas=(
            CompletionDelta(
                0, "hé", (1, 2), (PositionLogprobs(TokenLogprob(1, -0.5, "h"), (TokenLogprob(3, -1.0, "x"),)),), None
            ),
            CompletionDelta(1, "", (), None, "stop"),
        ),
        prompt_token_ids=(5, 6, 7),
        num_cached_tokens=16,
        finished=True,
        metrics=RequestMetrics(1.0, 1.1, 1.2, 1.3, 0),
    )  # fmt: skip
    assert event_from_wire("r-1", event_to_wire(event), (5, 6, 7)) == event
    rules = CacheRules(domains=(("t:a", DomainRule(floor_blocks=2)),), published=((1, 2, 3),))
    assert rules_from_wire(rules_to_wire(rules)) == rules


@pytest.mark.slow
def test_chat_through_the_engine_server(remote_gateway: LiveGateway) -> None:
    key, other = remote_gateway.tenant("acme"), remote_gateway.tenant("globex")
    client = remote_gateway.client(key)
    first = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0
    )
    again = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.usage is not None and again.usage is not None
    assert again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the same tenant's cache
    elsewhere = remote_gateway.client(other).chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert elsewhere.usage is not None and elsewhere.usage.prompt_tokens_details is not None
    assert elsewhere.usage.prompt_tokens_details.cached_tokens == 0  # never another tenant's
    _, text = stream_chat(client, MESSAGES, max_tokens=6)
    assert text == first.choices[0].message.content
    records = [r for r in remote_gateway.usage.records if r.status == 200]
    assert len(records) == 4 and sum(r.completion_tokens for r in records) == 4 * 6


@pytest.mark.slow
def test_a_bad_request_is_a_400_and_the_engine_checks_its_own_limits(
    remote_gateway: LiveGateway,
) -> None:
    key = remote_gateway.tenant("initech")
    with pytest.raises(openai.BadRequestError):
        remote_gateway.client(key).completions.create(
            model="tiny",
            prompt=[1] * 600,
            max_tokens=4,  # over the 512-token context
        )


def test_the_engine_refuses_callers_without_the_credential(
    engine: EngineProcess, remote_gateway: LiveGateway
) -> None:
    body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}
    url = engine.base_url + "/v1/completions"
    assert httpx.post(url, json=body).status_code == 401
    tenant_key = remote_gateway.tenant("hooli")  # a tenant's key is no service credential
    refused = httpx.post(url, json=body, headers={"authorization": f"Bearer {tenant_key}"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_token"
    assert httpx.get(engine.base_url + "/internal/stats").status_code == 401
    assert httpx.put(engine.base_url + "/internal/cache_rules", json={}).status_code == 401
    auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
    wrong_model = httpx.post(url, json={**body, "model": "other"}, headers=auth)
    assert wrong_model.status_code == 404
    assert httpx.post(url, content=b"{nope", headers=auth).status_code == 400
    bad_field = httpx.post(url, json={**body, "temperature": "hot"}, headers=auth)
    assert bad_field.status_code == 400 and "error" in bad_field.json()
    bad_rules = httpx.put(
        engine.base_url + "/internal/cache_rules", json={"published": [[-1]]}, headers=auth
    )
    assert bad_rules.status_code == 400


def test_the_engine_lists_its_model_and_answers_unknown_routes_in_openai_errors(
    engine: EngineProcess,
) -> None:
    auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
    assert httpx.get(engine.base_url + "/v1/models").status_code == 401
    # What OpenAI clients and serving benchmarks ask an endpoint first.
    client = openai.OpenAI(base_url=engine.base_url + "/v1", api_key=SERVICE_TOKEN)
    info = httpx.get(engine.base_url + "/internal/info", headers=auth).json()
    (model,) = client.models.list().data
    assert model.id == "tiny" and model.model_extra == {"max_model_len": info["max_model_len"]}
    missing = httpx.get(engine.base_url + "/nope", headers=auth)
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "Not Found",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    wrong_method = httpx.get(engine.base_url + "/v1/completions", headers=auth)
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    not_json = httpx.post(engine.base_url + "/v1/completions", content=b"{", headers=auth)
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    url, body = engine.base_url + "/v1/completions", {"prompt": [1, 2], "max_tokens": 1}
    no_model = httpx.post(url, json=body, headers=auth)
    assert no_model.status_code == 400
    assert no_model.json()["error"]["message"].startswith("you must provide a model parameter")
    other = httpx.post(url, json={**body, "model": "gpt-4o"}, headers=auth)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert other.json()["error"]["message"] == "this engine serves 'tiny', not 'gpt-4o'"


def test_health_and_vllm_metrics(engine: EngineProcess) -> None:
    assert httpx.get(engine.base_url + "/health").status_code == 200
    text = httpx.get(engine.base_url + "/metrics").text
    names = {f.name for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
        "vllm:prefix_cache_queries",
    ):
        assert name in names, name
    assert "cloister_kv_events_dropped" not in names  # it publishes no KV events
    assert 'num_gpu_blocks="' in text and 'model_name="tiny"' in text


def test_no_credential_no_start(model_dir: Path, tmp_path: Path) -> None:
    env = engine_env(model_dir, token=None)
    refused = subprocess.run(
        [*ENGINE_COMMAND, "--port", "1"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "no service credential" in refused.stderr and "Traceback" not in refused.stderr
    wide = subprocess.run(
        [*ENGINE_COMMAND, "--insecure-loopback", "--host", "0.0.0.0", "--port", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wide.returncode != 0 and "127.0.0.1 only" in wide.stderr
    short = subprocess.run(
        [*ENGINE_COMMAND, "--port", "1"],
        env={**env, "CLOISTER_SERVICE_TOKEN": "short"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert short.returncode != 0 and "at least 24 characters" in short.stderr


def test_a_taken_kv_events_port_is_a_clear_refusal(model_dir: Path) -> None:
    """The endpoint's form is checked with the settings; a port another process holds
    shows when the engine opens it: a one-line error, not a traceback."""
    import zmq

    holder = zmq.Context.instance().socket(zmq.PUB)
    port = holder.bind_to_random_port("tcp://*")
    try:
        env = {**engine_env(model_dir), "CLOISTER_KV_EVENTS_ENDPOINT": f"tcp://*:{port}"}
        refused = subprocess.run(
            [*ENGINE_COMMAND, "--port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        holder.close(linger=0)
    assert refused.returncode == 1, refused.stderr
    assert "cannot open the KV events endpoint" in refused.stderr
    # An operator's error, not a bug: no traceback, and no hint to run with --traceback.
    assert "Traceback" not in refused.stderr and "--traceback" not in refused.stderr


@pytest.mark.slow
def test_sigterm_drains_streams_and_admits_nothing_new(model_dir: Path, tmp_path: Path) -> None:
    engine = spawn_engine(model_dir, tmp_path / "drain.log")
    try:
        wait_ready(engine)
        auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
        body = {"model": "tiny", "prompt": list(range(10, 40)), "max_tokens": 300,
                "ignore_eos": True, "stream": True}  # fmt: skip
        events: list[str] = []

        def stream() -> None:
            with httpx.stream(
                "POST", engine.base_url + "/v1/completions", json=body, headers=auth, timeout=60
            ) as response:
                events.extend(line for line in response.iter_lines() if line.startswith("data:"))

        reader = threading.Thread(target=stream)
        reader.start()
        deadline = time.monotonic() + 30
        while len(events) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert events, engine.logs()
        engine.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.HTTPError):  # the listener is closed: nothing new comes in
            httpx.post(engine.base_url + "/v1/completions", json=body, headers=auth, timeout=5)
        reader.join(timeout=60)
        assert events[-1] == "data: [DONE]"
        finishes = [e for e in events if '"finish_reason":"length"' in e]
        assert len(finishes) == 1  # the running stream ran to its end
        # uvicorn shuts down cleanly, then re-raises the signal it caught (exit -15).
        assert engine.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in engine.logs()
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()


@pytest.mark.slow
def test_sigterm_finishes_the_links_streams_before_the_server_stops(
    model_dir: Path, tmp_path: Path
) -> None:
    """uvicorn closes WebSockets as soon as it shuts down; the engine waits for the
    link's streams first, tells the gateway it drains, and refuses new requests."""
    import asyncio

    engine = spawn_engine(model_dir, tmp_path / "drain-link.log")
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)

    async def drain() -> tuple[int, bool, str]:
        info = fetch_info(engine.base_url, SERVICE_TOKEN)
        tokenizer = load_tokenizer(model_dir)
        client = RemoteEngineClient(
            engine.base_url, token=SERVICE_TOKEN, tokenizer=tokenizer, info=info, poll_s=60
        )
        try:
            request = EngineRequest(prompt_token_ids=tuple(range(10, 40)), params=params)
            stream = client.submit(request)
            tokens = sum(len(d.token_ids) for d in (await stream.__anext__()).deltas)
            engine.proc.send_signal(signal.SIGTERM)
            async for event in stream:
                tokens += sum(len(d.token_ids) for d in event.deltas)
            alive = client.alive  # the engine said, over the link, that it drains
            late = EngineRequest(prompt_token_ids=(10, 11), params=params)
            try:
                async for _ in client.submit(late):
                    pass
                refused = "admitted"
            except Exception as exc:  # refused while draining, or the server is gone
                refused = type(exc).__name__
            return tokens, alive, refused
        finally:
            await client.shutdown()

    try:
        wait_ready(engine)
        tokens, alive, refused = asyncio.run(drain())
        assert tokens == 200  # the stream ran to its end through the drain
        assert not alive
        assert refused == "EngineUnavailableError"
        assert engine.proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in engine.logs()
    finally:
        if engine.proc.poll() is None:
            engine.proc.kill()


def test_a_router_may_send_text_and_ask_for_a_whole_response(engine: EngineProcess) -> None:
    """What a client of the Kubernetes inference stack sends: text, OpenAI's defaults."""
    auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
    url = engine.base_url + "/v1/completions"
    body = {"model": "tiny", "prompt": "The cache says hello", "max_tokens": 4, "temperature": 0}
    whole = httpx.post(url, json=body, headers=auth, timeout=60)
    assert whole.status_code == 200, whole.text
    out = whole.json()
    assert out["object"] == "text_completion" and len(out["choices"]) == 1
    assert out["choices"][0]["finish_reason"] in ("length", "stop")
    assert 1 <= out["usage"]["completion_tokens"] <= 4 and out["usage"]["prompt_tokens"] > 0
    streamed = httpx.post(url, json={**body, "stream": True}, headers=auth, timeout=60)
    lines = [ln for ln in streamed.text.splitlines() if ln.startswith("data: {")]
    text = "".join(c["text"] for ln in lines for c in json.loads(ln[6:])["choices"])
    assert text == out["choices"][0]["text"]  # greedy: the same answer either way
    empty = httpx.post(url, json={**body, "prompt": ""}, headers=auth, timeout=60)
    assert empty.status_code == 400 and "error" in empty.json()
