"""An engine server's /metrics, under vLLM's names so routers and dashboards work unchanged.

Read from the engine front at scrape time (a custom collector): nothing is counted on
the request path but the requests that name a LoRA adapter. The series carry
`model_name` (and an adapter's name) only, never a tenant. The adapter series are the
gateway's own (engine_hop.adapter_metrics): `vllm:lora_requests_info` from the engine's
per-adapter counts, and `cloister_adapter_requests_total` per adapter (counted as
requests are submitted, by EngineServer.submit). The engine's series are named and
described as the gateway's (engine_hop.engine_series): `cloister:kv_tier_*` per tier
among them, and under vLLM's names the figures of engine_hop.tier_metrics.tier_totals,
the one function both ends compute them with.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.fronts.async_engine import EngineFront
from engine_hop import engine_series as series
from engine_hop.adapter_metrics import AdapterMetrics, lora_snapshot
from engine_hop.tier_metrics import (
    OFFLOAD_TOTAL_BYTES,
    OFFLOAD_TOTAL_BYTES_HELP,
    TIER_ALIASES,
    TRANSFER_TYPES,
    tier_totals,
)


class EngineMetrics:
    """The collector and registry of one engine server."""

    def __init__(self, front: EngineFront, model_name: str) -> None:
        self._front, self._model = front, model_name
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.adapters = AdapterMetrics(self.registry)

    def collect(self) -> Iterator[Metric]:
        """The current series (prometheus_client's collector protocol)."""
        s = self._front.stats()
        labels, values = ["model_name"], [self._model]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        for field, (name, doc) in series.ENGINE_GAUGES.items():
            yield gauge(name, doc, getattr(s, field))
        counters = {**series.PREFIX_CACHE_COUNTERS, **series.ENGINE_COUNTERS}
        for field, (name, doc) in counters.items():
            value = getattr(s, field)
            if value is not None:  # kv_events_dropped: only an engine that publishes them
                yield counter(name, doc, value)
        yield from _tier_series(self._model, s.kv_tiers)
        yield from _tier_alias_series(self._model, s)
        yield from _spec_decode_series(self._model, s.spec_decode)
        info = InfoMetricFamily("vllm:cache_config", "The KV cache's configuration.")
        info.add_metric(
            [],
            {
                "model_name": self._model,
                "block_size": str(s.block_size),
                "num_gpu_blocks": str(s.num_blocks),
                "enable_prefix_caching": "True",
            },
        )
        yield info

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        self.adapters.update(self._model, lora_snapshot(self._front.stats()))
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _tier_series(model: str, tiers: Any) -> Iterator[Metric]:
    """cloister:kv_tier_* per tier (label `tier`: its medium), where the engine has any."""
    tiers = tuple(tiers or ())
    if not tiers:
        return
    labels = ["model_name", "tier"]
    for field, doc in series.TIER_GAUGES.items():
        g = GaugeMetricFamily(f"cloister:kv_tier_{field}", doc, labels=labels)
        for t in tiers:
            g.add_metric([model, t.medium], float(getattr(t, field)))
        yield g
    for field, doc in series.TIER_COUNTERS.items():
        c = CounterMetricFamily(f"cloister:kv_tier_{field}", doc, labels=labels)
        for t in tiers:
            c.add_metric([model, t.medium], float(getattr(t, field)))
        yield c


def _tier_alias_series(model: str, stats: Any) -> Iterator[Metric]:
    """The KV tiers under vLLM's names: `vllm:external_prefix_cache_{queries,hits}`,
    `vllm:kv_offload_{load,store}_bytes` and the older
    `vllm:kv_offload_total_bytes{transfer_type}`, from the gateway's own arithmetic
    (engine_hop.tier_metrics.tier_totals). None while no tier is on, as vLLM without a KV
    connector. Open like the rest of this /metrics: the engine server is reached only by
    gateways and Prometheus, and its series name no tenant."""
    if not tuple(getattr(stats, "kv_tiers", ()) or ()):
        return
    totals = tier_totals(stats)
    for key, value in totals.items():
        c = CounterMetricFamily(f"vllm:{key}", TIER_ALIASES[key], labels=["model_name"])
        c.add_metric([model], float(value))
        yield c
    older = CounterMetricFamily(
        OFFLOAD_TOTAL_BYTES, OFFLOAD_TOTAL_BYTES_HELP, labels=["model_name", "transfer_type"]
    )
    for key, transfer in TRANSFER_TYPES.items():
        older.add_metric([model, transfer], float(totals[key]))
    yield older


def _spec_decode_series(model: str, stats: Any) -> Iterator[Metric]:
    """vllm:spec_decode_* where the engine speculates (none while it is off, as vLLM)."""
    if stats is None:
        return
    for field, doc in series.SPEC_DECODE_COUNTERS.items():
        c = CounterMetricFamily(f"vllm:spec_decode_{field}", doc, labels=["model_name"])
        c.add_metric([model], float(getattr(stats, field)))
        yield c
    per_pos = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted, by their position in the draft (0: the first).",
        labels=["model_name", "position"],
    )
    for pos, count in enumerate(stats.accepted_per_pos):
        per_pos.add_metric([model, str(pos)], float(count))
    yield per_pos
