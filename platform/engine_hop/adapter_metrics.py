"""Per-adapter series: vLLM's `vllm:lora_requests_info` and a request counter.

`vllm:lora_requests_info{model_name, max_lora, running_lora_adapters,
waiting_lora_adapters}` is an info gauge, as vLLM's: one series per model whose value is
the time it was last set and whose labels carry the comma-joined adapter names. Running
and waiting adapters come from the engine's stats when it reports them
(`LoraSnapshot.running_adapters` / `waiting_adapters`: the gateway's EngineSnapshot, or
`lora_snapshot` of an engine front's stats); otherwise running is the
gateway's own count of in-flight requests per adapter and waiting is empty (the gateway
cannot see the engine's queue). `max_lora` is the engine's slot count, 0 when unknown.
Adapter names are a bounded set (the registry's), so they may be labels.

Both ends of the hop export these series from this class, so they never disagree: the
gateway's /metrics (gateway.metrics) and an engine server's (engine_server.metrics,
engine_server.adapters). The engine server counts requests as they are submitted, the
gateway as they finish.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from engine.stats import EngineStats


class LoraSnapshot(Protocol):
    """The adapter figures of an engine snapshot (engine_hop.client.EngineSnapshot has
    them)."""

    @property
    def max_loras(self) -> int:
        """The engine's adapter slots (0: not known)."""
        ...

    @property
    def running_adapters(self) -> tuple[str, ...] | None:
        """Adapters of running requests (None: not reported)."""
        ...

    @property
    def waiting_adapters(self) -> tuple[str, ...] | None:
        """Adapters of waiting requests (None: not reported)."""
        ...


@dataclass(frozen=True)
class LoraCounts:
    """A `LoraSnapshot` read straight from an engine front's stats."""

    max_loras: int
    running_adapters: tuple[str, ...] | None
    waiting_adapters: tuple[str, ...] | None


def lora_snapshot(stats: EngineStats) -> LoraCounts:
    """The adapter figures of an engine front's `stats()` (sequences per adapter name);
    a front that does not count them reports None."""

    def names(value: Mapping[str, int] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        return tuple(sorted(name for name, count in value.items() if count))

    return LoraCounts(
        max_loras=stats.max_loras,
        running_adapters=names(stats.lora_running),
        waiting_adapters=names(stats.lora_waiting),
    )


class AdapterMetrics:
    """The adapter series of one registry, and the gateway's in-flight count per adapter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.info = Gauge(
            "vllm:lora_requests_info",
            "Running and waiting LoRA adapters (value: when last set, unix seconds).",
            ["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            registry=registry,
        )
        self.requests = Counter(
            "cloister_adapter_requests",
            "Requests that selected a LoRA adapter.",
            ["model_name", "adapter"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._in_flight: dict[str, Tally[str]] = {}  # model -> adapter -> requests
        self._labels: dict[str, tuple[str, str, str, str]] = {}  # model -> its info labels

    def started(self, *, model: str, adapter: str) -> None:
        """One request of `adapter` is in flight."""
        with self._lock:
            self._in_flight.setdefault(model, Tally())[adapter] += 1

    def submitted(self, *, model: str, adapter: str | None) -> None:
        """An engine server took a request naming `adapter` (None: no adapter, not
        counted); it counts at submission, since it does not see the request end."""
        if adapter is not None:
            self.requests.labels(model, adapter).inc()

    def finished(self, *, model: str, adapter: str) -> None:
        """One request of `adapter` finished; it is counted."""
        with self._lock:
            tally = self._in_flight.setdefault(model, Tally())
            tally[adapter] -= 1
            if tally[adapter] <= 0:
                del tally[adapter]
        self.requests.labels(model, adapter).inc()

    def request_counts(self) -> dict[str, int]:
        """Finished requests per adapter since start, over every model."""
        counts: dict[str, int] = {}
        for metric in self.requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    name = sample.labels["adapter"]
                    counts[name] = counts.get(name, 0) + int(sample.value)
        return counts

    def in_flight(self, model: str) -> dict[str, int]:
        """Requests in flight per adapter of `model`, by the gateway's count."""
        with self._lock:
            return dict(self._in_flight.get(model, {}))

    def update(self, model: str, snap: LoraSnapshot) -> None:
        """Sets `model`'s info series (replacing the one with its old labels)."""
        if snap.running_adapters is not None:
            running = sorted(snap.running_adapters)
            waiting = sorted(snap.waiting_adapters or ())
        else:
            running = sorted(self.in_flight(model))
            waiting = []
        labels = (model, str(snap.max_loras), ",".join(running), ",".join(waiting))
        with self._lock:
            old = self._labels.get(model)
            if old is not None and old != labels:
                self.info.remove(*old)
            self._labels[model] = labels
            self.info.labels(*labels).set(time.time())
