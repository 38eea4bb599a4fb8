"""Over HTTP: on a model whose every layer has a sliding window (Mistral v0.1's shape), a
request longer than the whole KV pool is served, since each sequence gives back the
blocks behind its window; the same request on the model without a window is refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.utils.built_app import tiny_model_app
from tests.utils.hf_families import make_family_dir

WINDOW = 8
# A small pool and small prefill chunks: a sequence then holds at most
# engine.validation.window_peak_tokens (here 96 tokens), far under the pool.
SETTINGS = {"kv_cache_bytes": 256 * 1024, "prefill_chunk_size": 32, "max_model_len": 2048}


def serve(tmp_path: Path, window: int | None) -> Iterator[tuple[TestClient, dict[str, str]]]:
    folder = make_family_dir(tmp_path / "m", "mistral", seed=3, sliding_window=window)
    client, key = tiny_model_app(tmp_path, model=str(folder), **SETTINGS)
    with client:
        yield client, {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:
    yield from serve(tmp_path_factory.mktemp("windowed"), WINDOW)


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:
    yield from serve(tmp_path_factory.mktemp("full"), None)


def pool_tokens(full: tuple[TestClient, dict[str, str]]) -> int:
    """The pool's size, as the model without a window states it refusing a request."""
    client, headers = full
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 2000}
    r = client.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
    found = re.search(r"the whole cache holds (\d+)", error["message"])
    assert found is not None, error["message"]
    return int(found.group(1))


def test_a_request_longer_than_the_pool_is_served_on_a_window_model(
    windowed: tuple[TestClient, dict[str, str]], full: tuple[TestClient, dict[str, str]]
) -> None:
    pool = pool_tokens(full)
    assert pool < 1000
    client, headers = windowed
    prompt = " ".join(f"w{i}" for i in range(60))  # several windows, in chunks of 32
    want = pool + 100
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": want,
        "temperature": 0,
        "ignore_eos": True,
    }
    r = client.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["usage"]["completion_tokens"] == want
    assert done["usage"]["prompt_tokens"] + want > pool
    assert done["choices"][0]["finish_reason"] == "length"
    # Streamed, twice at once from two requests: the same greedy text each time.
    streams = []
    for _ in range(2):
        with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True}, headers=headers
        ) as s:
            assert s.status_code == 200
            streams.append("".join(line for line in s.iter_lines()))
    assert all("[DONE]" in text for text in streams)


def test_the_window_model_still_refuses_past_its_context(
    windowed: tuple[TestClient, dict[str, str]],
) -> None:
    client, headers = windowed
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 5000}
    r = client.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "context" in error["message"]
