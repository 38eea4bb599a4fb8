"""Prometheus metrics of one gateway app, in a registry the app owns.

Engine-side series use vLLM's names so that existing dashboards work; gauges and
counters derived from `EngineClient.stats()` are refreshed when /metrics is scraped.
Tenant labels are bounded: the first `top_tenants` distinct tenants keep their
name, every later one is reported as "other".

Tenant-labelled series name tenants and show their traffic, so they live in a
registry of their own that only operators see (routes/metrics.py), with the engine
replicas' series (named by internal addresses) and the prefix cache's queries and hits
(summed over tenants, they would show a prober others' cache traffic); the public
registry holds engine-level series without a tenant in them.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine_hop.adapter_metrics import AdapterMetrics
from engine_hop.client import EngineSnapshot
from engine_hop.engine_series import (
    ENGINE_COUNTERS,
    ENGINE_GAUGES,
    PREFIX_CACHE_COUNTERS,
    SPEC_DECODE_COUNTERS,
    TIER_COUNTERS,
    TIER_GAUGES,
)
from engine_hop.replicas import ReplicaState
from engine_hop.tier_metrics import (
    OFFLOAD_TOTAL_BYTES,
    OFFLOAD_TOTAL_BYTES_HELP,
    TIER_ALIASES,
    TRANSFER_TYPES,
    tier_totals,
)
from gateway.request_outcomes import EngineRequestOutcome
from tenancy.scopes import tenant_id_of

OTHER_TENANT = "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# vLLM's 1-2-5 series for token counts, up to a 200k context.
_TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(6) for m in (1, 2, 5))
# The KV cache holds the model's own dtype: vLLM's "auto".
CACHE_DTYPE = "auto"
# Tenant ids whose names the gateway remembers for the per-tenant KV series (most recently
# authenticated kept): the engine reports tenants by id only.
TENANT_NAMES_KEPT = 4096


# The gateway's own figures of each engine snapshot, besides the tables both ends export
# (engine_hop.engine_series): its ITL budget's cap (gauge) and the tokens it counted.
_GATEWAY_GAUGES = {
    "prefill_token_cap": (
        "cloister_engine_prefill_token_cap",
        "Prompt tokens the next engine step may carry under the ITL budget.",
    ),
}
_TOKEN_COUNTERS = {
    "num_prompt_tokens": (
        "vllm:prompt_tokens",
        "Prompt tokens of requests whose prefill finished.",
    ),
    "num_generation_tokens": ("vllm:generation_tokens", "Tokens generated."),
}

# Each finished sample's histograms, by EngineRequestOutcome field: (series, help, buckets).
_OUTCOME_HISTOGRAMS = {
    "prompt_tokens": (
        "vllm:request_prompt_tokens",
        "Prompt tokens per finished request.",
        _TOKEN_BUCKETS,
    ),
    "generation_tokens": (
        "vllm:request_generation_tokens",
        "Generated tokens per finished request.",
        _TOKEN_BUCKETS,
    ),
    "max_tokens": (
        "vllm:request_max_num_generation_tokens",
        "The max_tokens of finished requests.",
        _TOKEN_BUCKETS,
    ),
    "prefill_s": (
        "vllm:request_prefill_time_seconds",
        "First scheduled to first token.",
        _LATENCY_BUCKETS,
    ),
    "decode_s": ("vllm:request_decode_time_seconds", "First token to finished.", _LATENCY_BUCKETS),
}

# The engine's per-tenant preemption figures (engine.stats.TenantKVStats fields), exported
# as cloister_tenant_<field>_total.
_TENANT_PREEMPTION_COUNTERS = {
    "preemptions_suffered": "The tenant's sequences preempted by the engine.",
    "preemptions_caused": "Other tenants' sequences preempted to make room for this tenant's.",
}

# Overlap scheduling's step kinds (label `mode`), counted by EngineSnapshot.num_<mode>_steps.
_STEP_MODES = ("overlapped", "synchronous")

_Series = TypeVar("_Series", Counter, Gauge)


def _model_series(
    kind: type[_Series], table: Mapping[str, tuple[str, str]], registry: CollectorRegistry
) -> dict[str, _Series]:
    """One `model_name`-labelled series of `kind` per entry of `table` (key -> (series,
    help)), by the table's key."""
    return {
        key: kind(series, text, ["model_name"], registry=registry)
        for key, (series, text) in table.items()
    }


def _advance(child: Counter, now: float, before: float | None) -> None:
    """Advances a counter's series by how much an engine's cumulative figure grew since
    its last snapshot (`before`; None: none yet). A smaller figure means the engine
    restarted, so it counts from its zero."""
    grown = now - before if before is not None and now >= before else now
    if grown > 0:
        child.inc(grown)


class TenantLabeler:
    """Maps tenant names to a bounded label set (first come, first kept)."""

    def __init__(self, top_n: int) -> None:
        self._top_n = top_n
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def label(self, tenant: str) -> str:
        """`tenant` itself while fewer than `top_n` names are kept, else "other"."""
        with self._lock:
            if tenant in self._kept:
                return tenant
            if len(self._kept) < self._top_n:
                self._kept.add(tenant)
                return tenant
        return OTHER_TENANT


class GatewayMetrics:
    """All series of one app; `render` refreshes the engine-derived ones first.

    Engine and latency series carry the `model_name` label of the base model (each has
    its own engine); `model_name` here is the label when a caller names none.
    """

    def __init__(self, *, model_name: str, top_tenants: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)  # public: no tenant in it
        self.tenant_registry = CollectorRegistry(auto_describe=True)  # operators only
        self.model_name = model_name
        self.tenants = TenantLabeler(top_tenants)
        r, t = self.registry, self.tenant_registry
        m = ["model_name"]
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", m, registry=r,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Time between streamed tokens.", m, registry=r,
            buckets=_ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", m, registry=r,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "Time spent waiting to be scheduled.", m,
            registry=r, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.engine_gauges = _model_series(Gauge, {**ENGINE_GAUGES, **_GATEWAY_GAUGES}, r)
        # The prefix cache's figures move with every tenant's traffic (an anonymous
        # scraper could watch them move with its own probes): operators only (issue 46).
        self.engine_counters = {
            **_model_series(Counter, PREFIX_CACHE_COUNTERS, t),
            **_model_series(Counter, {**ENGINE_COUNTERS, **_TOKEN_COUNTERS}, r),
        }
        # The KV tiers under the device pool (label `tier`: the medium, "CPU_HOST" for
        # L2). Their hits and write-backs move with every tenant's traffic, so, like the
        # prefix-cache hits, operators only.
        tm = [*m, "tier"]
        self.kv_tier_gauges = {
            field: Gauge(f"cloister:kv_tier_{field}", text, tm, registry=t)
            for field, text in TIER_GAUGES.items()
        }
        self.kv_tier_counters = {
            field: Counter(f"cloister:kv_tier_{field}", text, tm, registry=t)
            for field, text in TIER_COUNTERS.items()
        }
        # The same tiers under vLLM's names (tier_totals), so its dashboards' external
        # cache and offload panels work; as their source, operators only.
        self.tier_aliases = {
            name: Counter(f"vllm:{name}", text, m, registry=t)
            for name, text in TIER_ALIASES.items()
        }
        self.offload_total_bytes = Counter(
            OFFLOAD_TOTAL_BYTES, OFFLOAD_TOTAL_BYTES_HELP, [*m, "transfer_type"], registry=t
        )
        # Speculative decoding, vLLM's series. Acceptance depends on what the requests
        # generate, so the sums over tenants move with other tenants' traffic: operators
        # only, like the prefix-cache hits.
        self.spec_decode_counters = {
            field: Counter(f"vllm:spec_decode_{field}", text, m, registry=t)
            for field, text in SPEC_DECODE_COUNTERS.items()
        }
        self.spec_decode_per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by their position in the draft (0: the first).",
            [*m, "position"], registry=t,
        )  # fmt: skip
        self.request_success = Counter(
            "vllm:request_success", "Finished requests by finish reason.",
            [*m, "finished_reason"], registry=r,
        )  # fmt: skip
        self.outcome_histograms = {
            field: Histogram(series, text, m, registry=r, buckets=buckets)
            for field, (series, text, buckets) in _OUTCOME_HISTOGRAMS.items()
        }
        self.engine_steps = Counter(
            "cloister_engine_steps_total",
            "Engine steps under overlap scheduling: launched while the step before ran "
            "(overlapped) or run in turn because a row needed the previous token first "
            "(synchronous). No series where overlap scheduling is off.",
            [*m, "mode"], registry=r,
        )  # fmt: skip
        self.cache_config = Gauge(
            "vllm:cache_config_info", "The KV cache's configuration (value 1).",
            [*m, "block_size", "num_gpu_blocks", "cache_dtype"], registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "cloister_requests", "Gateway requests by outcome.", ["tenant", "status", "model"],
            registry=t,
        )  # fmt: skip
        self.limiter_rejections = Counter(
            "cloister_limiter_rejections", "Requests denied by a limit.", ["tenant", "reason"],
            registry=t,
        )  # fmt: skip
        self.limiter_backend_errors = Counter(
            "cloister_limiter_backend_errors", "Limiter backend failures.", registry=r
        )
        self.adapters = AdapterMetrics(r)  # adapter names are bounded: public labels
        # Model names are bounded (the registry's): public labels, like the vllm series.
        self.fallbacks = Counter(
            "cloister:fallback_requests",
            "Interactive requests refused by an overloaded model's engine, taken by its fallback.",
            ["model_name", "fallback"], registry=r,
        )  # fmt: skip
        # Engine replicas are named by their internal addresses: operators only.
        replica = ["model_name", "replica"]
        self.replica_up = Gauge(
            "cloister_engine_replica_up",
            "1 while an engine server is in service for this gateway, 0 once it left.",
            replica,
            registry=t,
        )
        self.replica_in_flight = Gauge(
            "cloister_engine_replica_in_flight",
            "This gateway's requests streaming from each engine replica of a replica set.",
            replica,
            registry=t,
        )
        # The engine's per-tenant KV figures (engine.stats.TenantKVStats), by tenant name.
        tenant_model = ["tenant", "model_name"]
        self.tenant_kv_blocks = Gauge(
            "cloister_tenant_kv_blocks_in_use",
            "KV blocks held by the tenant's running sequences.", tenant_model, registry=t,
        )  # fmt: skip
        self.tenant_preemptions = {
            field: Counter(f"cloister_tenant_{field}", text, tenant_model, registry=t)
            for field, text in _TENANT_PREEMPTION_COUNTERS.items()
        }
        self._tenant_names: OrderedDict[str, str] = OrderedDict()  # tenant id -> name
        self._tenant_kv_labels: dict[str, set[str]] = {}  # per model: gauge labels set now
        self._replicas: dict[str, set[str]] = {}  # per model: the replicas labelled now
        self._last: dict[str, EngineSnapshot] = {}  # per model: the previous snapshot
        self._last_backend_errors = 0
        self._lock = threading.Lock()

    def name_tenant(self, tenant_id: str, name: str) -> None:
        """Remembers an authenticated tenant's name, for the series the engine reports by
        tenant id (the most recently named `TENANT_NAMES_KEPT` are kept)."""
        with self._lock:
            self._tenant_names[tenant_id] = name
            self._tenant_names.move_to_end(tenant_id)
            while len(self._tenant_names) > TENANT_NAMES_KEPT:
                self._tenant_names.popitem(last=False)

    def _tenant_label(self, key: str) -> str:
        """The bounded label of an engine fairness key ("t:<tenant id>"): the tenant's
        name where this gateway authenticated it, else the id itself."""
        tenant_id = tenant_id_of(key)
        return self.tenants.label(self._tenant_names.get(tenant_id, tenant_id))

    def _update_tenant_kv(
        self, name: str, snap: EngineSnapshot, last: EngineSnapshot | None
    ) -> None:
        """Sets `name`'s per-tenant KV gauge (labels no longer reported are removed) and
        advances the preemption counters by each key's change (the caller holds the lock).

        A key the engine no longer reports had no live work and no preemption left (an
        engine restart): its figures count from zero when it comes back."""
        before = last.tenant_kv if last is not None else {}
        blocks: dict[str, int] = {}
        for key, now in snap.tenant_kv.items():
            label = self._tenant_label(key)
            blocks[label] = blocks.get(label, 0) + now.blocks_in_use
            prev = before.get(key)
            for field, counter in self.tenant_preemptions.items():
                old = None if prev is None else int(getattr(prev, field))
                _advance(counter.labels(label, name), int(getattr(now, field)), old)
        for label in self._tenant_kv_labels.get(name, set()) - set(blocks):
            with contextlib.suppress(KeyError):
                self.tenant_kv_blocks.remove(label, name)
        for label, count in blocks.items():
            self.tenant_kv_blocks.labels(label, name).set(count)
        self._tenant_kv_labels[name] = set(blocks)

    def _update_kv_tiers(
        self, name: str, snap: EngineSnapshot, last: EngineSnapshot | None
    ) -> None:
        """Sets `name`'s KV tier gauges and advances their counters (the caller holds the
        lock); a smaller value than the last one means the engine restarted."""
        before = {t.medium: t for t in last.kv_tiers} if last is not None else {}
        for tier in snap.kv_tiers:
            for field, gauge in self.kv_tier_gauges.items():
                gauge.labels(name, tier.medium).set(getattr(tier, field))
            prev = before.get(tier.medium)
            for field, counter in self.kv_tier_counters.items():
                now = int(getattr(tier, field))
                old = None if prev is None else int(getattr(prev, field))
                _advance(counter.labels(name, tier.medium), now, old)
        now_totals = tier_totals(snap)
        old_totals = tier_totals(last) if last is not None else {}
        for key, value in now_totals.items():
            prior = old_totals.get(key)  # (floats: the transfer times are seconds)
            children = [self.tier_aliases[key].labels(name)]
            if key in TRANSFER_TYPES:
                children.append(self.offload_total_bytes.labels(name, TRANSFER_TYPES[key]))
            for child in children:  # created at 0: a tier with no traffic yet still shows
                _advance(child, value, prior)

    def _update_spec_decode(
        self, name: str, snap: EngineSnapshot, last: EngineSnapshot | None
    ) -> None:
        """Advances `name`'s speculative decoding counters (the caller holds the lock); a
        smaller value than the last one means the engine restarted. Nothing while the
        engine does not speculate (no series at all, as vLLM without a speculative config)."""
        now = snap.spec_decode
        if now is None:
            return
        prev = last.spec_decode if last is not None else None
        for field, counter in self.spec_decode_counters.items():
            old = None if prev is None else int(getattr(prev, field))
            _advance(counter.labels(name), int(getattr(now, field)), old)
        before = prev.accepted_per_pos if prev is not None else ()
        for pos, value in enumerate(now.accepted_per_pos):
            old_pos = before[pos] if pos < len(before) else None
            _advance(self.spec_decode_per_pos.labels(name, str(pos)), int(value), old_pos)

    def observe_request(self, *, tenant: str, status: int, model: str) -> None:
        """Counts one finished request under its bounded tenant label."""
        self.requests.labels(self.tenants.label(tenant), str(status), model).inc()

    def observe_fallback(self, *, model: str, fallback: str) -> None:
        """Counts one request `model`'s overloaded engine refused and `fallback` took."""
        self.fallbacks.labels(model, fallback).inc()

    def observe_rejection(self, *, tenant: str, reason: str) -> None:
        """Counts one limiter denial."""
        self.limiter_rejections.labels(self.tenants.label(tenant), reason).inc()

    def observe_timings(
        self,
        *,
        ttft_s: float | None,
        e2e_s: float,
        queue_s: float | None,
        itl_s: list[float],
        model: str | None = None,
    ) -> None:
        """Records one request's latency histograms under its model (None: the default)."""
        name = model or self.model_name
        if ttft_s is not None:
            self.ttft.labels(name).observe(ttft_s)
        self.e2e.labels(name).observe(e2e_s)
        if queue_s is not None:
            self.queue_time.labels(name).observe(max(0.0, queue_s))
        itl = self.itl.labels(name)
        for gap in itl_s:
            itl.observe(gap)

    def observe_outcomes(
        self, outcomes: list[EngineRequestOutcome], *, model: str | None = None
    ) -> None:
        """Records each finished sample's lengths, finish reason and prefill/decode time."""
        name = model or self.model_name
        for one in outcomes:
            self.request_success.labels(name, one.finished_reason).inc()
            for field, histogram in self.outcome_histograms.items():
                value: float | None = getattr(one, field)
                if value is not None:  # no max_tokens, or a sample that never ran
                    histogram.labels(name).observe(value)

    def update_engine(self, snap: EngineSnapshot, *, model: str | None = None) -> None:
        """Sets `model`'s gauges and advances its counters by the change since its last
        snapshot (None: the default model)."""
        name = model or self.model_name
        with self._lock:
            for field, gauge in self.engine_gauges.items():
                value: float | None = getattr(snap, field)
                if value is not None:
                    gauge.labels(name).set(value)
            last = self._last.get(name)
            for field, counter in self.engine_counters.items():
                now: int | None = getattr(snap, field)
                if now is not None:
                    # labels() makes the series at 0: a model with no traffic yet still shows
                    _advance(counter.labels(name), now, getattr(last, field) if last else None)
            for mode in _STEP_MODES:
                field = f"num_{mode}_steps"
                steps: int = getattr(snap, field)
                if steps:  # only engines that overlap report any
                    before = getattr(last, field) if last else None
                    _advance(self.engine_steps.labels(name, mode), steps, before)
            if snap.num_blocks and (last is None or last.num_blocks != snap.num_blocks):
                self.cache_config.labels(
                    name, str(snap.block_size), str(snap.num_blocks), CACHE_DTYPE
                ).set(1)
            self._update_tenant_kv(name, snap, last)
            self._update_kv_tiers(name, snap, last)
            self._update_spec_decode(name, snap, last)
            self._last[name] = snap
        self.adapters.update(name, snap)

    def update_replicas(self, model: str, states: Sequence[ReplicaState]) -> None:
        """Sets the series of `model`'s engine servers (an in-process engine has none);
        drops those of servers no longer among them (a pod gone from the headless
        Service)."""
        remote = {s.replica: s for s in states if not s.in_process}
        with self._lock:
            for url in self._replicas.get(model, set()) - set(remote):
                self.replica_up.remove(model, url)
                with contextlib.suppress(KeyError):  # never counted: no series
                    self.replica_in_flight.remove(model, url)
            for url, state in remote.items():
                self.replica_up.labels(model, url).set(1 if state.alive else 0)
                if state.in_flight is not None:
                    self.replica_in_flight.labels(model, url).set(state.in_flight)
            self._replicas[model] = set(remote)

    def update_limiter(self, backend_errors: int) -> None:
        """Advances the backend-error counter to the limiter's own cumulative count.

        The limiter counts every failed backend call (acquires that fell back or were
        refused, and releases), which the request path cannot all see.
        """
        with self._lock:
            delta = backend_errors - self._last_backend_errors
            if delta > 0:
                self.limiter_backend_errors.inc(delta)
            self._last_backend_errors = max(self._last_backend_errors, backend_errors)

    def render(
        self,
        snap: EngineSnapshot | Mapping[str, EngineSnapshot] | None,
        *,
        limiter_backend_errors: int | None = None,
        include_tenants: bool = False,
        replicas: Mapping[str, Sequence[ReplicaState]] | None = None,
    ) -> bytes:
        """The exposition text, after folding in `snap`, the limiter's count and each
        model's engine replicas (`replicas`, engine_hop.replicas) when given.

        `snap` is the default model's snapshot, or a snapshot per model name.

        Tenant-labelled series are in it only with `include_tenants` (an operator asked).
        """
        if isinstance(snap, EngineSnapshot):
            self.update_engine(snap)
        elif snap is not None:
            for model, one in snap.items():
                self.update_engine(one, model=model)
        if limiter_backend_errors is not None:
            self.update_limiter(limiter_backend_errors)
        for model, states in (replicas or {}).items():
            self.update_replicas(model, states)
        text = generate_latest(self.registry)
        if include_tenants:
            text += generate_latest(self.tenant_registry)
        return text
