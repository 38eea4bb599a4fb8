"""A LoRA adapter end to end in the split deployment: two `cloister engine serve`
processes (tiny model), a gateway over them (CLOISTER_ENGINE_URLS, in this process).

A PEFT zip uploaded through the admin API is pushed by the registry sync to both
engine servers within 5 s, changes the model's answer when named as "tiny:<adapter>",
is billed under its name, is a 404 for another tenant, and is unloaded from both when
retired. The real engine's refusals (wrong shapes, a rank over max_lora_rank) come back
as 400s with its message; each replica reports its device and dtype, and its /metrics
the LoRA series. (test_adapters_real_engine.py is the in-process version.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select

from admin.models import UsageRow
from tests.admin.zip_archives import adapter_files, zip_of
from tests.gateway.engine_servers import SERVICE_TOKEN, EngineProcess, engine_servers
from tests.utils.adapter_requests import PROMPT, assert_hidden, greedy_logprobs, tiny_adapter_app
from tests.utils.built_app import sdk_over, wait_until
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow
SERVICE = {"authorization": f"Bearer {SERVICE_TOKEN}"}


def _zip_folder(folder: Path) -> bytes:
    return zip_of({p.name: p.read_bytes() for p in folder.iterdir()})


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("lora-split")
    model = make_tiny_model_dir(tmp / "models")
    adapter = make_peft_adapter(tmp / "peft", model, rank=8, alpha=16, seed=3, magnitude=1.0)
    with engine_servers(model, tmp / "engine-logs", 2) as engines:
        urls = tuple(e.base_url for e in engines)
        with tiny_adapter_app(tmp, model, engine_urls=urls, service_token=SERVICE_TOKEN) as app:
            # The gateway records the served base model over engine servers too, so an
            # adapter can name it without the operator registering it first.
            listed = app["client"].get("/admin/api/v1/models", headers=app["admin"])
            assert listed.status_code == 200, listed.text
            tiny = [m for m in listed.json()["items"] if m["name"] == "tiny"]
            assert len(tiny) == 1 and tiny[0]["status"] == "loaded", listed.text
            yield {**app, "engines": engines, "adapter": adapter, "model": model}


def _sdk(split: dict[str, Any], key: str) -> openai.OpenAI:
    return sdk_over(split["client"], key)


def _loaded(engine: EngineProcess) -> set[str]:
    listing = httpx.get(f"{engine.base_url}/internal/adapters", headers=SERVICE, timeout=10)
    assert listing.status_code == 200, listing.text
    return {a["name"] for a in listing.json()["adapters"]}


def test_an_uploaded_adapter_is_pushed_served_billed_and_retired(split: dict[str, Any]) -> None:
    client, engines = split["client"], split["engines"]
    upload = client.post(
        "/admin/api/v1/adapters/upload",
        params={"name": "my-lora", "base_model": "tiny", "owner_tenant": "alpha"},
        content=_zip_folder(split["adapter"]),
        headers=split["admin"],
    )
    assert upload.status_code == 201, upload.text
    # Servable within 5 s of the upload, on every replica, without a restart.
    wait_until(
        lambda: all("my-lora" in _loaded(e) for e in engines), 5.0, "not pushed to both in 5 s"
    )
    alpha = _sdk(split, split["key_a"])
    wait_until(lambda: "tiny:my-lora" in {m.id for m in alpha.models.list()}, 5.0, "not listed")

    def logprobs(model: str) -> list[float]:
        return greedy_logprobs(alpha, model, PROMPT)

    base, tuned = logprobs("tiny"), logprobs("tiny:my-lora")
    assert max(abs(a - b) for a, b in zip(base, tuned, strict=True)) > 1e-3
    assert logprobs("tiny:my-lora") == tuned  # the same answer, whichever replica ran it

    def usage_rows() -> int:
        with split["sessions"]() as s:
            rows = s.scalars(select(UsageRow).where(UsageRow.adapter == "my-lora")).all()
        assert {r.model for r in rows} <= {"tiny"}
        return len(rows)

    wait_until(lambda: usage_rows() == 2, 10.0, "the adapter's usage was not recorded")
    served = [httpx.get(f"{e.base_url}/metrics", timeout=10).text for e in engines]
    assert all('vllm:lora_requests_info{max_lora="4"' in text for text in served)
    counted = 'cloister_adapter_requests_total{adapter="my-lora",model_name="tiny"}'
    assert any(counted in text for text in served)  # on the replica(s) that ran them

    retired = client.patch(
        "/admin/api/v1/adapters/my-lora", json={"status": "retired"}, headers=split["admin"]
    )
    assert retired.status_code == 200, retired.text
    wait_until(lambda: not any(_loaded(e) for e in engines), 5.0, "not unloaded from both in 5 s")


def test_another_tenant_gets_the_404_an_unknown_name_gets(split: dict[str, Any]) -> None:
    beta = _sdk(split, split["key_b"])
    assert_hidden(beta, "tiny:my-lora", "tiny:no-such", PROMPT)


def test_the_real_engine_refuses_bad_adapters_with_its_message(
    split: dict[str, Any], tmp_path: Path
) -> None:
    engine = split["engines"][0]
    too_big = make_peft_adapter(tmp_path / "r32", split["model"], rank=32, alpha=32)
    cases = {
        "rank": _zip_folder(too_big),  # over max_lora_rank (16)
        # made for a base with hidden size 16, not 64
        "expected A (4, 64)": zip_of(adapter_files()),
    }
    for says, body in cases.items():
        response = httpx.put(
            f"{engine.base_url}/internal/adapters/bad", content=body, headers=SERVICE, timeout=30
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_adapter" and says in error["message"], error
    gone = httpx.delete(f"{engine.base_url}/internal/adapters/never", headers=SERVICE)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "adapter_not_found"
    assert "bad" not in _loaded(engine)


def test_each_replica_reports_its_device_and_dtype(split: dict[str, Any]) -> None:
    engines = split["engines"]
    info = httpx.get(f"{engines[0].base_url}/internal/info", headers=SERVICE).json()
    assert (info["device"], info["dtype"], info["max_loras"]) == ("cpu", "float32", 4)
    view = split["client"].get("/admin/api/v1/engines", headers=split["admin"])
    assert view.status_code == 200, view.text
    (model,) = view.json()["models"]
    replicas = {r["replica"]: (r["device"], r["dtype"]) for r in model["replicas"]}
    assert replicas == {e.base_url: ("cpu", "float32") for e in engines}
