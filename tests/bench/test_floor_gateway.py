"""bench/floor_gateway.py: the benchmark's floor answers what the engine generates, one Redis count each."""

from __future__ import annotations

import secrets
from pathlib import Path

import redis
from starlette.testclient import TestClient

from bench.floor_gateway import FloorApp
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from server.settings import Settings
from tests.utils.fast_fake_model import fast_fake_llm_engine
from tests.utils.services import delete_prefix, redis_url

MESSAGES = [{"role": "user", "content": "Write one sentence about caches."}]


def _offline_text(settings: Settings, prompt_ids: list[int], max_tokens: int) -> str:
    from assembly.engine_options import serve_engine_options

    engine = fast_fake_llm_engine(**serve_engine_options(settings))
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    engine.add_request(
        EngineRequest(
            prompt_token_ids=tuple(prompt_ids),
            params=params,
            request_id="offline",
            cache_domain="t:offline",
        )
    )
    text = []
    while engine.has_unfinished():
        for event in engine.step():
            text.extend(d.text for d in event.deltas)
    return "".join(text)


def test_floor_answers_the_engines_text_and_counts_each_request_in_redis(tmp_path: Path) -> None:
    url = redis_url()
    prefix = f"cloister:test-floor:{secrets.token_hex(4)}:"
    settings = Settings(
        data_dir=tmp_path, engine_mode="thread", redis_url=url, redis_key_prefix=prefix
    )
    app = FloorApp(settings, MESSAGES)
    client = redis.Redis.from_url(url)
    try:
        with TestClient(app) as http:
            assert http.get("/health").status_code == 200
            answers = [http.post("/v1/chat/completions", json={"max_tokens": 5}) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200]
        texts = {a.json()["choices"][0]["message"]["content"] for a in answers}
        assert texts == {_offline_text(settings, app.prompt_ids, 5)}
        assert int(client.get(prefix + "floor:requests") or 0) == 3
    finally:
        delete_prefix(client, prefix)
        client.close()
