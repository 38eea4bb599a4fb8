"""The real engine front for LoRA adapter tests over the fake fast model, with what the
tests read and the failures they script.

`adapter_test_engine(config)` builds an AsyncEngine whose model has the shape of the HF
`config` (so that adapters made for that shape load: tests/admin/zip_archives.py's are
for a model of hidden size 16), the fake fast model's forward pass and SmolLM2's
tokenizer. The engine loads, lists, serves and unloads adapters itself; the front adds:

- `loaded_adapters`: the loaded adapters by name (the front's own listing);
  `loads`: how many loads reached the engine; `adapter_of`: the adapter each request
  the engine took named.
- `pinned_adapters`: names whose unload is refused with the engine's own
  AdapterInUseError, as while a request runs on them (a scripted failure: the fake
  model's requests end too fast to hold one).
- `report_lora=False`: `stats()` leaves the adapter figures out (`max_loras` 0, no
  per-adapter counts), as a front that does not count them reports: the gateway then
  falls back on its own counts.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from engine.engine_builder import build_config
from engine.errors import AdapterInUseError
from engine.fronts.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from engine.lora.peft import AdapterInfo
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import LoadedModel
from engine.model.tokenizer import load_hf_tokenizer
from engine.request import EngineRequest
from engine.stats import EngineStats
from tests.admin.zip_archives import HEADS, HIDDEN, INTERMEDIATE, KV_HEADS
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, FastFakeModel
from tests.utils.tiny_model import smollm2_tokenizer_dir, tiny_config

# The shape of the model tests/admin/zip_archives.py's adapters are made for.
ARCHIVE_SHAPE: dict[str, Any] = {
    "num_hidden_layers": 1,
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "intermediate_size": INTERMEDIATE,
}


def shaped_fake_llm_engine(config: dict[str, Any], **options: Any) -> LLMEngine:
    """An LLMEngine over the fake fast model with the shape of the HF `config` (its
    vocabulary SmolLM2's, for the tokenizer) and `GATEWAY_ENGINE_OPTIONS` (`options`
    override them)."""
    folder = smollm2_tokenizer_dir()
    arch = architecture_from_config({**tiny_config(), **config})
    fake = LoadedModel(
        model=FastFakeModel(arch.vocab_size),  # type: ignore[arg-type]
        arch=arch,
        tokenizer=load_hf_tokenizer(folder),
        revision="fast-fake",
        name="fast-fake",
    )
    return LLMEngine(build_config(str(folder), **{**GATEWAY_ENGINE_OPTIONS, **options}), fake)


class AdapterTestEngine(AsyncEngine):
    """The real front, recording adapter loads and requests' adapters, with scripted
    in-use refusals of unloads (see the module's docstring)."""

    def __init__(self, engine: LLMEngine, *, report_lora: bool = True) -> None:
        super().__init__(engine)
        self.report_lora = report_lora
        self.loads = 0
        self.adapter_of: dict[str, str | None] = {}  # request id -> the adapter it named
        self.pinned_adapters: set[str] = set()  # adapters a test holds "in use"

    @property
    def loaded_adapters(self) -> dict[str, AdapterInfo]:
        """The loaded adapters by name, as the front last heard from the engine."""
        return {a.name: a for a in self.adapters()}

    def submit(self, request: EngineRequest) -> Any:
        """The real `submit`; the request's adapter is recorded once it is taken."""
        stream = super().submit(request)
        self.adapter_of[request.request_id] = request.adapter
        return stream

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """The real load, counted."""
        self.loads += 1
        return await super().load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        """The real unload; refused as in use while `name` is pinned."""
        if name in self.pinned_adapters:
            raise AdapterInUseError(f"adapter {name!r} is in use")
        await super().unload_adapter(name)

    def forget_adapters(self, timeout_s: float = 30.0) -> None:
        """Unloads every adapter, as an engine that restarted comes back without them;
        called from another thread than the front's loop (a test's), which it waits on."""
        loop = self._loop
        assert loop is not None, "the front is not started"
        for name in list(self.loaded_adapters):
            unload = AsyncEngine.unload_adapter(self, name)  # the real one: never pinned
            asyncio.run_coroutine_threadsafe(unload, loop).result(timeout_s)

    def stats(self) -> EngineStats:
        """The real counters; without `report_lora`, the adapter figures left out."""
        stats = super().stats()
        if self.report_lora:
            return stats
        return dataclasses.replace(
            stats,
            max_loras=0,
            lora_running=None,  # type: ignore[arg-type]  # a front that does not count
            lora_waiting=None,  # type: ignore[arg-type]
        )


def adapter_test_engine(
    config: dict[str, Any], *, report_lora: bool = True, **options: Any
) -> AdapterTestEngine:
    """An `AdapterTestEngine` over `shaped_fake_llm_engine(config, **options)`."""
    return AdapterTestEngine(shaped_fake_llm_engine(config, **options), report_lora=report_lora)
