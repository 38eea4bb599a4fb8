"""The adapter seams without a server: model-name parsing, the in-process client over
a front's adapter calls, the registry sync's failure handling, and the lora info
gauge's sources."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest

from admin import registry
from assembly.adapter_sync import AdapterSync
from engine.errors import AdapterInUseError as EngineInUse
from engine.fronts.async_engine import AsyncEngine
from engine.lora.peft import AdapterInfo as EngineAdapterInfo
from engine.model.hf_loader import architecture_from_config
from engine_hop.adapters import AdapterInfo
from engine_hop.adapters import AdapterInUseError as GatewayInUse
from engine_hop.client import EngineSnapshot
from engine_hop.in_process import InProcessEngineClient
from gateway.adapters import split_model
from gateway.metrics import GatewayMetrics
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.tiny_model import tiny_config


def test_split_model() -> None:
    assert split_model("tiny:my-adapter") == ("tiny", "my-adapter")
    assert split_model("org/model:a:b") == ("org/model", "a:b")
    for plain in ("tiny", "tiny:", ":adapter"):
        assert split_model(plain) == (plain, None)


def test_the_engines_in_use_error_and_records_reach_the_gateway_as_they_are() -> None:
    async def unload(name: str) -> None:
        raise EngineInUse(f"{name} has 2 running requests")

    def adapters() -> list[EngineAdapterInfo]:
        return [EngineAdapterInfo("a", 8, 16.0, "d" * 64, ("q",))]

    front = SimpleNamespace(
        model_name="tiny", max_model_len=64, vocab_size=10, unload_adapter=unload, adapters=adapters
    )
    client = InProcessEngineClient(front)
    with pytest.raises(GatewayInUse) as caught:
        asyncio.run(client.unload_adapter("a"))
    assert "2 running requests" in str(caught.value)
    assert client.adapters() == [AdapterInfo("a", 8, 16.0, "d" * 64, ("q",))]


class BrokenFolderEngine(AsyncEngine):
    """The real front over the fake fast model; fails to load one adapter (a bad
    folder), loads the rest."""

    async def load_adapter(self, name: str, path: str) -> Any:
        """The engine's load, but for "bad", which raises."""
        if name == "bad":
            raise ValueError("adapter_model.safetensors is unreadable")
        return await super().load_adapter(name, path)


def _peft(folder: Path) -> str:
    """A rank-2 PEFT adapter for the fake fast model's shape."""
    arch = architecture_from_config(tiny_config())
    return str(make_peft_adapter(folder, arch, rank=2, alpha=4))


def _sync_twice(engine: AsyncEngine, sync: AdapterSync) -> tuple[bool, bool]:
    """Two sync passes, on one event loop with the engine running."""

    async def run() -> tuple[bool, bool]:
        await engine.start()
        try:
            return await sync.sync_once(), await sync.sync_once()
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def test_the_sync_loads_what_it_can_logs_a_failure_once_and_marks_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        registry.register_model(s, name="m", source="/x", format="gguf", context_length=64)
        registry.register_model(s, name="other", source="/y", format="gguf", context_length=64)
        for name, model in (("good", "m"), ("bad", "m"), ("elsewhere", "other")):
            path = _peft(tmp_path / name)
            registry.register_adapter(s, name=name, base_model=model, rank=2, source_path=path)
    engine = BrokenFolderEngine(fast_fake_llm_engine(**GATEWAY_ENGINE_OPTIONS))
    sync = AdapterSync(InProcessEngineClient(engine, model_name="m"), sessions, interval_s=0.0)
    with caplog.at_level(logging.ERROR, logger="cloister.adapters"):
        first, second = _sync_twice(engine, sync)
        assert first is True
        assert second is False  # nothing new; the failure not re-logged
    assert {a.name for a in engine.adapters()} == {"good"}  # never another model's adapter
    # The sync's own records only: the real engine logs its start-up at INFO, which an
    # earlier test's log set-up may let through.
    records = [r for r in caplog.records if r.name == "cloister.adapters"]
    assert [r.getMessage().count("bad") for r in records] == [1]
    with sessions() as s:
        statuses = {a.name: a.status for a in registry.list_adapters(s)}
    assert statuses == {"good": "loaded", "bad": "registered", "elsewhere": "registered"}


def _info_lines(metrics: GatewayMetrics) -> list[str]:
    text = generate_latest(metrics.registry).decode()
    return [ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]


def test_lora_info_from_the_engine_when_it_reports_else_the_gateways_counts() -> None:
    metrics = GatewayMetrics(model_name="m", top_tenants=5)
    metrics.adapters.started(model="m", adapter="b")
    metrics.adapters.started(model="m", adapter="a")
    metrics.update_engine(EngineSnapshot(2, 0, 0.0, 0, 0, 0))
    (line,) = _info_lines(metrics)
    assert 'running_lora_adapters="a,b"' in line and 'waiting_lora_adapters=""' in line
    engine_says = EngineSnapshot(
        1, 1, 0.0, 0, 0, 0, max_loras=4, running_adapters=("a",), waiting_adapters=("c",)
    )
    metrics.update_engine(engine_says)
    (line,) = _info_lines(metrics)  # the series with the old labels is gone
    assert 'max_lora="4"' in line and 'running_lora_adapters="a"' in line
    assert 'waiting_lora_adapters="c"' in line
    metrics.adapters.finished(model="m", adapter="a")
    metrics.adapters.finished(model="m", adapter="b")
    assert metrics.adapters.in_flight("m") == {}
    assert metrics.adapters.request_counts() == {"a": 1, "b": 1}
