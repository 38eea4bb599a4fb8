"""The one block `cloister serve` logs once it serves: what runs, with which policies, where.

Cloister is serving
  model      smollm2-135m-instruct  (context 8192; KV 2048 blocks x 16 = 32768 tokens)
  engine     device cpu, dtype float32, attention torch, thread mode
  isolation  cache per tenant unless a tenant narrows it; prefix cache hash; ...
  fairness   fair_lpm scheduling; concurrency reject; limiter in-memory
  API        http://127.0.0.1:8000/v1
  ...
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gateway.engine_client import EngineClient
from server.logging_setup import MESSAGE_HAS_FIELDS
from server.settings import Settings

logger = logging.getLogger("cloister.serve")


@dataclass(frozen=True)
class ServedModel:
    """One served model as the summary shows it."""

    name: str
    context_tokens: int
    kv_blocks: int
    block_size: int

    @property
    def kv_tokens(self) -> int:
        """Tokens the model's KV pool holds."""
        return self.kv_blocks * self.block_size


@dataclass(frozen=True)
class StartupSummary:
    """What the start-up block says; `text` renders it, `fields` is its JSON form."""

    models: tuple[ServedModel, ...]
    device: str
    dtype: str
    attention: str
    engine_mode: str
    isolation: str
    fairness: str
    urls: dict[str, str]

    def text(self) -> str:
        """The block, one line per item, for a person."""
        lines = ["Cloister is serving"]
        for m in self.models:
            kv = (
                f"KV {m.kv_blocks} blocks x {m.block_size} = {m.kv_tokens} tokens"
                if m.kv_blocks
                else "KV size unknown"
            )
            lines.append(f"  {'model':<10} {m.name}  (context {m.context_tokens}; {kv})")
        lines.append(
            f"  {'engine':<10} device {self.device}, dtype {self.dtype}, "
            f"attention {self.attention}, {self.engine_mode} mode"
        )
        lines.append(f"  {'isolation':<10} {self.isolation}")
        lines.append(f"  {'fairness':<10} {self.fairness}")
        lines.extend(f"  {name:<10} {url}" for name, url in self.urls.items())
        return "\n".join(lines)

    def fields(self) -> dict[str, Any]:
        """The same, as plain data for a JSON log line."""
        data = asdict(self)
        for model, served in zip(data["models"], self.models, strict=True):
            model["kv_tokens"] = served.kv_tokens
        return data


def build_summary(
    settings: Settings,
    engines: Mapping[str, EngineClient],
    engine_options: Mapping[str, Any],
) -> StartupSummary:
    """The summary of a server about to serve `engines`, started with `engine_options`
    (the resolved ones; empty when the engine was built by the caller)."""
    models = []
    for name, engine in engines.items():
        snap = engine.stats()
        models.append(
            ServedModel(
                name=name,
                context_tokens=int(engine.max_model_len),
                kv_blocks=snap.num_blocks,
                block_size=snap.block_size,
            )
        )
    floors = []
    if settings.min_cached_blocks:
        floors.append(f"{settings.min_cached_blocks} blocks")
    if settings.min_cached_share:
        floors.append(f"{settings.min_cached_share:.0%} of the pool")
    isolation = (
        f"cache per tenant unless a tenant narrows it (key, user); prefix cache "
        f"{settings.prefix_cache}; floor per domain {' or '.join(floors) or 'none'}; "
        f"flood floor {settings.fair_cached_share:.0%} of the pool split among tenants; "
        f"strict partition {'on' if settings.strict_partition else 'off'}; "
        f"scrub freed blocks {'on' if settings.scrub_freed_blocks else 'off'}"
    )
    fairness = (
        f"{settings.scheduling_policy} scheduling (per tenant, by weight); KV shares "
        f"{'on' if settings.kv_shares else 'off (newest sequence preempted)'}; "
        f"concurrency {settings.concurrency_mode}; limiter "
        f"{'redis' if settings.redis_url else 'in-memory'} (fail {settings.limiter_fail_mode})"
    )
    base = f"http://{settings.host}:{settings.port}"
    return StartupSummary(
        models=tuple(models),
        device=str(engine_options.get("device", "given")),
        dtype=str(engine_options.get("dtype", "given")),
        attention=str(engine_options.get("attention_backend", "given")),
        engine_mode=settings.engine_mode,
        isolation=isolation,
        fairness=fairness,
        urls={
            "API": f"{base}/v1",
            "console": f"{base}/admin",
            "docs": f"{base}/docs",
            "metrics": f"{base}/metrics",
        },
    )


def log_summary(summary: StartupSummary) -> None:
    """Logs the block once: readable text, with its fields for JSON sinks."""
    logger.info(summary.text(), extra={"startup": summary.fields(), MESSAGE_HAS_FIELDS: True})
