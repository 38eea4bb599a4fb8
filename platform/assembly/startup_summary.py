"""The one block `cloister serve` logs once it serves: what runs, with which policies, where.

Cloister is serving
  model      smollm2-135m-instruct  (llama, Q4_1+Q8_0; context 8192; KV 2048 blocks x 16 = ...)
  engine     device cpu, dtype float32, weights int4 (auto, from Q4_1 GGUF), attention cpu, thread mode
  decoding   speculative decoding off; overlap scheduling on
  isolation  cache per tenant unless a tenant narrows it; prefix cache hash; ...
  fairness   fair_lpm scheduling; concurrency reject; limiter in-memory
  API        http://127.0.0.1:8000/v1
  ...
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from engine_hop.client import EngineClient
from gateway.batch_api.blob_factory import files_location
from server.logging_setup import MESSAGE_HAS_FIELDS
from server.settings import Settings

if TYPE_CHECKING:
    from engine.planning.model_source import ModelFacts

logger = logging.getLogger("cloister.serve")


@dataclass(frozen=True)
class ServedModel:
    """One served model as the summary shows it."""

    name: str
    context_tokens: int
    kv_blocks: int
    block_size: int
    family: str = ""  # engine.model.registry's name; "" when the caller built the engine
    quantization: str = ""  # how its matrices are stored (Q4_K+Q6_K, BF16, ...)
    sliding_window: int | None = None
    window_layers: int = 0  # how many layers use the window
    window_frees_blocks: bool = False  # every layer has it: blocks behind it are freed
    experts: tuple[int, int] | None = None  # (experts, per token) of an MoE model
    # Which linears run: "int4 (auto, from Q4_1 GGUF)", "none", ...; "" when not known.
    weights: str = ""

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
    # "speculative decoding off", or its method, draft length and batch limit.
    decoding: str = "speculative decoding off"
    files: str = ""  # where the Batch API's file bodies live ("": not shown)

    def text(self) -> str:
        """The block, one line per item, for a person."""
        lines = ["Cloister is serving"]
        for m in self.models:
            kv = (
                f"KV {m.kv_blocks} blocks x {m.block_size} = {m.kv_tokens} tokens"
                if m.kv_blocks
                else "KV size unknown"
            )
            facts = [f for f in (m.family, m.quantization) if f]
            if m.experts is not None:
                facts.append(f"{m.experts[0]} experts, {m.experts[1]} per token")
            if m.sliding_window is not None:
                freed = " (blocks behind it freed)" if m.window_frees_blocks else ""
                facts.append(
                    f"sliding window {m.sliding_window} on {m.window_layers} layers{freed}"
                )
            head = f"{', '.join(facts)}; " if facts else ""
            lines.append(f"  {'model':<10} {m.name}  ({head}context {m.context_tokens}; {kv})")
        lines.append(
            f"  {'engine':<10} device {self.device}, dtype {self.dtype}, "
            f"{self._weights()}attention {self.attention}, {self.engine_mode} mode"
        )
        lines.append(f"  {'decoding':<10} {self.decoding}")
        lines.append(f"  {'isolation':<10} {self.isolation}")
        lines.append(f"  {'fairness':<10} {self.fairness}")
        if self.files:
            lines.append(f"  {'files':<10} {self.files}")
        lines.extend(f"  {name:<10} {url}" for name, url in self.urls.items())
        return "\n".join(lines)

    def _weights(self) -> str:
        """ "weights X, " when every model runs X, else each model's; "" when unknown."""
        known = [m for m in self.models if m.weights]
        if not known:
            return ""
        if len({m.weights for m in known}) == 1:
            return f"weights {known[0].weights}, "
        return f"weights {'; '.join(f'{m.name}: {m.weights}' for m in known)}, "

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
    paths = {spec.name: spec.path for spec in settings.served_models}
    models = []
    for name, engine in engines.items():
        snap = engine.stats()
        facts = _facts(paths.get(name)) if engine_options and name in paths else None
        models.append(
            ServedModel(
                name=name,
                context_tokens=int(engine.max_model_len),
                kv_blocks=snap.num_blocks,
                block_size=snap.block_size,
                family=facts.family if facts else "",
                quantization=facts.quantization if facts else "",
                sliding_window=facts.sliding_window if facts else None,
                window_layers=facts.window_layers if facts else 0,
                window_frees_blocks=facts.window_frees_blocks if facts else False,
                experts=facts.experts if facts else None,
                weights=_weights(engine_options, paths.get(name)) if name in paths else "",
            )
        )
    floors = []
    if settings.engine.min_cached_blocks:
        floors.append(f"{settings.engine.min_cached_blocks} blocks")
    if settings.engine.min_cached_share:
        floors.append(f"{settings.engine.min_cached_share:.0%} of the pool")
    isolation = (
        f"cache per tenant unless a tenant narrows it (key, user); prefix cache "
        f"{settings.engine.prefix_cache}; floor per domain {' or '.join(floors) or 'none'}; "
        f"flood floor {settings.engine.fair_cached_share:.0%} of the pool split among tenants; "
        f"strict partition {'on' if settings.engine.strict_partition else 'off'}; "
        f"scrub freed blocks {'on' if settings.engine.scrub_freed_blocks else 'off'}"
    )
    fairness = (
        f"{settings.engine.scheduling_policy} scheduling (per tenant, by weight); KV shares "
        f"{'on' if settings.engine.kv_shares else 'off (newest sequence preempted)'}; "
        f"concurrency {settings.gateway.concurrency_mode}; limiter "
        f"{'redis' if settings.redis_url else 'in-memory'} (fail {settings.gateway.limiter_fail_mode})"
    )
    base = f"http://{settings.host}:{settings.port}"
    return StartupSummary(
        models=tuple(models),
        device=str(engine_options.get("device", "given")),
        dtype=str(engine_options.get("dtype", "given")),
        attention=str(engine_options.get("attention_backend", "given")),
        engine_mode=settings.engine.engine_mode,
        isolation=isolation,
        fairness=fairness,
        decoding=f"{describe_speculation(engine_options)}; {describe_overlap(engine_options)}",
        files=files_location(settings),
        urls={
            "API": f"{base}/v1",
            "console": f"{base}/admin",
            "docs": f"{base}/docs",
            "metrics": f"{base}/metrics",
        },
    )


def describe_speculation(engine_options: Mapping[str, Any]) -> str:
    """Whether the engines speculate, and how, from the resolved engine options ("given"
    when the caller built the engine, as for the device)."""
    method = engine_options.get("speculative_method")
    if method is None:
        return "speculative decoding as the given engine was built"
    if method == "off":
        return "speculative decoding off"
    limit = engine_options.get("speculative_max_batch")
    batch = (
        f"none above {limit} running sequences"
        if limit is not None
        else "batch limit from measured step costs"
    )
    tokens = engine_options.get("num_speculative_tokens")
    model = engine_options.get("speculative_model")
    how = f"{method} with {model}" if model else str(method)
    return f"speculative decoding on ({how}, up to {tokens} draft tokens a step; {batch})"


def describe_overlap(engine_options: Mapping[str, Any]) -> str:
    """Whether the engines prepare each step while the one before runs (engine/overlap.py)."""
    if "overlap_scheduling" not in engine_options:
        return "overlap scheduling as the given engine was built"
    if not engine_options["overlap_scheduling"]:
        return "overlap scheduling off"
    speculating = engine_options.get("speculative_method", "off") != "off"
    if speculating or engine_options.get("kv_host_bytes"):
        why = "speculative decoding" if speculating else "the KV tiers"
        return f"overlap scheduling off (not with {why})"
    return "overlap scheduling on"


def _facts(path: str | None) -> ModelFacts | None:
    """The served file's family and storage (None: the bundled model); None if unreadable,
    since the summary never stops a server that loaded the model."""
    from engine.model.loader import default_model_path
    from engine.planning.model_source import read_model_facts

    try:
        return read_model_facts(path or default_model_path())
    except Exception:  # noqa: BLE001 (any reader error only leaves the facts out)
        logger.warning("could not read the family of %s", path, exc_info=True)
        return None


def _weights(engine_options: Mapping[str, Any], path: str | None) -> str:
    """Which linears the model at `path` (None: the bundled one) runs under the resolved
    `weight_quant` option: "auto" is resolved again as its engine did (same file, same
    device), with why; "" when the caller built the engine or the file is unreadable."""
    setting = engine_options.get("weight_quant")
    if setting is None:
        return ""
    if setting != "auto":
        return str(setting)
    from engine.model.loader import default_model_path
    from engine.model.quant import choose_weight_quant

    try:
        return choose_weight_quant(
            path or default_model_path(), engine_options["device"]
        ).describe()
    except Exception:  # noqa: BLE001 (the summary never stops a server that loaded the model)
        logger.warning("could not read the storage type of %s", path, exc_info=True)
        return "auto"


def log_summary(summary: StartupSummary) -> None:
    """Logs the block once: readable text, with its fields for JSON sinks."""
    logger.info(summary.text(), extra={"startup": summary.fields(), MESSAGE_HAS_FIELDS: True})
