"""A LoRA adapter end to end on the real engine (tiny random model): a PEFT zip uploaded
through the admin API is loaded by the registry sync without a restart, changes the
model's answer when named as "tiny:<adapter>", is billed under its name, and is a 404
for another tenant. The server has one adapter slot (CLOISTER_MAX_LORAS=1): two
adapters streamed at once take turns in it and each gives its own answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import select

from admin.models import UsageRow
from tests.admin.zip_archives import zip_of
from tests.utils.adapter_requests import PROMPT, assert_hidden, greedy_logprobs, tiny_adapter_app
from tests.utils.built_app import sdk_over, wait_until
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("lora-real")
    model = make_tiny_model_dir(tmp / "models")
    adapter = make_peft_adapter(tmp / "peft", model, rank=8, alpha=16, seed=3, magnitude=1.0)
    second = make_peft_adapter(tmp / "peft2", model, rank=4, alpha=8, seed=5, magnitude=1.0)
    with tiny_adapter_app(
        tmp,
        model,
        attention_backend="torch",
        max_model_len=256,
        kv_cache_bytes=8 * 1024 * 1024,
        max_loras=1,
        lora_slot_quantum=1,
    ) as app:
        for name, folder in (("my-lora", adapter), ("my-other", second)):
            files = {p.name: p.read_bytes() for p in Path(folder).iterdir()}
            upload = app["client"].post(
                "/admin/api/v1/adapters/upload",
                params={"name": name, "base_model": "tiny", "owner_tenant": "alpha"},
                content=zip_of(files),
                headers=app["admin"],
            )
            assert upload.status_code == 201, upload.text
        yield app


def _sdk(served: dict[str, Any], key: str) -> openai.OpenAI:
    return sdk_over(served["client"], key)


def test_an_uploaded_adapter_is_served_and_billed_under_its_name(served: dict[str, Any]) -> None:
    alpha = _sdk(served, served["key_a"])
    # Servable within 5 s of the upload, no restart.
    wait_until(
        lambda: "tiny:my-lora" in {m.id for m in alpha.models.list()},
        5.0,
        "the adapter did not become servable in 5 s",
    )

    def logprobs(model: str) -> list[float]:
        return greedy_logprobs(alpha, model, PROMPT)

    base, tuned = logprobs("tiny"), logprobs("tiny:my-lora")
    assert max(abs(a - b) for a, b in zip(base, tuned, strict=True)) > 1e-3
    assert logprobs("tiny:my-lora") == tuned  # the adapter's own answer is stable
    deadline = time.monotonic() + 10.0
    while True:  # usage reaches the database through the metering writer
        with served["sessions"]() as s:
            rows = s.scalars(select(UsageRow).where(UsageRow.adapter == "my-lora")).all()
        if len(rows) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(rows) == 2 and {r.model for r in rows} == {"tiny"}
    # The console's view: the real engine says the adapter sits in a device slot now
    # (it stays resident after its requests; nothing else needed the slot).
    runtime = served["client"].get("/admin/api/v1/adapters/runtime", headers=served["admin"])
    assert runtime.status_code == 200, runtime.text
    assert runtime.json()["my-lora"] == {"state": "device", "requests": 2}


def test_another_tenant_gets_the_404_an_unknown_name_gets(served: dict[str, Any]) -> None:
    beta = _sdk(served, served["key_b"])
    assert_hidden(beta, "tiny:my-lora", "tiny:no-such", PROMPT)


def test_two_adapters_share_one_slot_over_http(served: dict[str, Any]) -> None:
    """max_loras=1: streams on two adapters at once both finish, each with the tokens it
    gets alone, and /metrics reports the one slot."""
    alpha = _sdk(served, served["key_a"])
    wait_until(
        lambda: {"tiny:my-lora", "tiny:my-other"} <= {m.id for m in alpha.models.list()},
        5.0,
        "the adapters did not become servable in 5 s",
    )

    def tokens(model: str) -> str:
        stream = alpha.completions.create(
            model=model, prompt=PROMPT, max_tokens=24, temperature=0, stream=True
        )
        return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

    alone = {model: tokens(model) for model in ("tiny:my-lora", "tiny:my-other")}
    assert alone["tiny:my-lora"] != alone["tiny:my-other"]
    models = ["tiny:my-lora", "tiny:my-other"] * 3
    with ThreadPoolExecutor(len(models)) as pool:
        together = list(pool.map(tokens, models))
    assert together == [alone[m] for m in models]
    metrics = served["client"].get("/metrics").text
    assert 'max_lora="1"' in metrics
