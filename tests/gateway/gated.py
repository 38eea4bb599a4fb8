"""A live gateway over the real engine with `cloister serve`'s engine options and the
gated fake model: closed, the engine stops inside its next step and its inbox fills,
so a test can build a backlog exactly, then open the gate and watch what happens."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from assembly.engine_options import serve_engine_options
from engine.fronts.async_engine import AsyncEngine
from server.settings import Settings
from tenancy.limiter.memory import MemoryLimiter
from tests.utils.fast_fake_model import GatedFakeModel, fast_fake_llm_engine
from tests.utils.live_gateway import LiveGateway, start_gateway
from tests.utils.tiny_model import SMOLLM2_VOCAB


def start_gated_gateway(
    tmp_path: Path, **options: Any
) -> tuple[LiveGateway, GatedFakeModel, Callable[[], None]]:
    """The gateway, its gated model (gate closed) and a stop function that opens the
    gate first; `options` override the service's engine options."""
    model = GatedFakeModel(SMOLLM2_VOCAB)
    engine_options = serve_engine_options(Settings(data_dir=tmp_path, device="cpu"))
    engine_options.update(options)
    engine = AsyncEngine(fast_fake_llm_engine(model=model, **engine_options))
    gw, stop = start_gateway(tmp_path, engine=engine, limiter=MemoryLimiter())

    def stop_all() -> None:
        model.gate.set()
        stop()

    return gw, model, stop_all


@contextmanager
def gated_gateway(
    tmp_path: Path, *, max_model_len: int, num_blocks: int
) -> Iterator[tuple[LiveGateway, GatedFakeModel]]:
    """`start_gated_gateway` with a pool of `num_blocks` blocks, no KV byte budget and no
    ITL budget; yields the gateway and its model, and stops them at the end."""
    # No ITL budget: it would learn a prompt token's cost from a gated step, which lasts as
    # long as the test holds the gate, and cap every later step at its 16-token floor.
    gw, model, stop = start_gated_gateway(
        tmp_path,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        kv_cache_bytes=None,
        itl_budget_ms=None,
    )
    try:
        yield gw, model
    finally:
        stop()
