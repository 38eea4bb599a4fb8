"""Speculative decoding's series (issue 40) under vLLM's names: on the gateway's /metrics
(operators only, advanced by deltas, safe across an engine restart), on an engine
server's own /metrics, and carried from engine servers through /internal/stats to a
gateway's replica set, whose replicas' counters are summed."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import generate_latest
from starlette.testclient import TestClient

from engine.speculative.stats import SpecDecodeStats
from engine.stats import EngineStats
from engine_hop.client import EngineSnapshot, sum_spec_decode
from engine_hop.in_process import InProcessEngineClient
from engine_hop.stats_json import spec_decode_from_json, spec_decode_to_json
from gateway.metrics import GatewayMetrics
from tests.admin.engine_stand_ins import (
    FixedStatsEngine,
    idle_stats,
    polled_replica_set,
    remote_engine_server,
)

SPEC = SpecDecodeStats(
    num_drafts=10, num_draft_tokens=40, num_accepted_tokens=25, accepted_per_pos=(9, 7, 5, 4)
)
TOKEN = "svc-token-for-the-spec-decode-test"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def _snap(spec: SpecDecodeStats | None) -> EngineSnapshot:
    return EngineSnapshot(0, 0, 0.0, 0, 0, 0, spec_decode=spec)


def _series(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their label text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def _per_pos(text: str, model: str = "tiny") -> list[float]:
    samples = _series(text, PER_POS)
    return [samples[f'{{model_name="{model}",position="{i}"}}'] for i in range(len(samples))]


def test_gateway_series_are_operator_only_and_advance_by_deltas() -> None:
    metrics = GatewayMetrics(model_name="tiny", top_tenants=4)
    metrics.update_engine(_snap(SPEC))
    assert "spec_decode" not in generate_latest(metrics.registry).decode()
    text = generate_latest(metrics.tenant_registry).decode()
    assert _series(text, DRAFTS) == {'{model_name="tiny"}': 10.0}
    assert _series(text, DRAFT_TOKENS) == {'{model_name="tiny"}': 40.0}
    assert _series(text, ACCEPTED) == {'{model_name="tiny"}': 25.0}
    assert _per_pos(text) == [9, 7, 5, 4]
    grown = SpecDecodeStats(14, 56, 33, (13, 9, 7, 4))
    metrics.update_engine(_snap(grown))
    text = generate_latest(metrics.tenant_registry).decode()
    assert _series(text, ACCEPTED) == {'{model_name="tiny"}': 33.0}
    assert _per_pos(text) == [13, 9, 7, 4]
    # A restarted engine counts from zero: its whole value is added to each counter.
    metrics.update_engine(_snap(SpecDecodeStats(2, 8, 3, (2, 1, 0, 0))))
    text = generate_latest(metrics.tenant_registry).decode()
    assert _series(text, DRAFTS) == {'{model_name="tiny"}': 16.0}
    assert _series(text, ACCEPTED) == {'{model_name="tiny"}': 36.0}
    assert _per_pos(text) == [15, 10, 7, 4]


def test_no_series_while_speculation_is_off() -> None:
    """As vLLM without a speculative config: no spec_decode samples at all, not zeros."""
    metrics = GatewayMetrics(model_name="tiny", top_tenants=4)
    metrics.update_engine(_snap(None))
    text = generate_latest(metrics.tenant_registry).decode()
    assert _series(text, DRAFTS) == {} and _series(text, PER_POS) == {}
    # An in-process engine whose stats carry none reports none.
    assert InProcessEngineClient(FixedStatsEngine(idle_stats())).stats().spec_decode is None
    local = InProcessEngineClient(FixedStatsEngine(idle_stats(spec_decode=SPEC)))
    assert local.stats().spec_decode == SPEC


def test_an_engine_server_exports_its_own_series() -> None:
    from types import SimpleNamespace

    from engine_server.metrics import EngineMetrics

    stats = idle_stats(spec_decode=SPEC)
    text = EngineMetrics(SimpleNamespace(stats=lambda: stats), "tiny").render()[0].decode()
    assert _series(text, DRAFTS) == {'{model_name="tiny"}': 10.0}
    assert _series(text, DRAFT_TOKENS) == {'{model_name="tiny"}': 40.0}
    assert _series(text, ACCEPTED) == {'{model_name="tiny"}': 25.0}
    assert _per_pos(text) == [9, 7, 5, 4]
    off = idle_stats()
    text = EngineMetrics(SimpleNamespace(stats=lambda: off), "tiny").render()[0].decode()
    assert "spec_decode" not in text


def test_the_json_form_round_trips_and_tolerates_other_versions() -> None:
    assert spec_decode_from_json(spec_decode_to_json(SPEC)) == SPEC
    assert spec_decode_to_json(None) is None and spec_decode_from_json(None) is None
    # A server of another version: left out, never a failed poll.
    wrong_type = {**(spec_decode_to_json(SPEC) or {}), "num_drafts": "1"}
    for junk in ("x", [1], {"num_drafts": 1}, wrong_type):
        assert spec_decode_from_json(junk) is None, junk
    no_positions = {"num_drafts": 1, "num_draft_tokens": 2, "num_accepted_tokens": 1}
    assert spec_decode_from_json(no_positions) == SpecDecodeStats(1, 2, 1, ())


def test_sums_over_replicas_add_counters_and_positions() -> None:
    other = SpecDecodeStats(3, 6, 2, (2, 0))
    total = sum_spec_decode([SPEC, None, other])
    assert total == SpecDecodeStats(13, 46, 27, (11, 7, 5, 4))
    assert sum_spec_decode([None, None]) is None


def _stats_json(stats: EngineStats) -> dict[str, object]:
    """What a real engine server's GET /internal/stats answers for `stats`."""
    from engine_server.app import EngineServer
    from engine_server.auth import ServiceAuth
    from tests.utils.fast_fake_model import gateway_test_engine

    engine = gateway_test_engine()
    engine.stats = lambda: stats  # type: ignore[method-assign,assignment,return-value]
    app = EngineServer(engine, model_name="remote", auth=ServiceAuth(TOKEN)).app()
    with TestClient(app) as client:
        r = client.get("/internal/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_remote_replicas_carry_their_counters_and_the_gateway_sums_them() -> None:
    """Two engine servers, one speculating more than the other: each /internal/stats
    carries its counters, the replica set sums them, and the gateway's /metrics shows the
    sum under the model's name."""
    other = replace(SPEC, num_drafts=1, num_draft_tokens=4, num_accepted_tokens=4)
    other = replace(other, accepted_per_pos=(1, 1, 1, 1))
    bodies = [_stats_json(idle_stats(spec_decode=s)) for s in (SPEC, other)]
    assert bodies[0]["spec_decode"] == {
        "num_drafts": 10,
        "num_draft_tokens": 40,
        "num_accepted_tokens": 25,
        "accepted_per_pos": [9, 7, 5, 4],
    }
    assert _stats_json(idle_stats())["spec_decode"] is None
    servers = [remote_engine_server(body) for body in bodies]
    try:
        remote = polled_replica_set([url for _, url in servers])
        carried = [r.stats().spec_decode for r in remote.replicas()]
        summed = remote.stats().spec_decode
    finally:
        for srv, _ in servers:
            srv.shutdown()
    assert carried in ([SPEC, other], [other, SPEC])
    assert summed == SpecDecodeStats(11, 44, 29, (10, 8, 6, 5))
    metrics = GatewayMetrics(model_name="remote", top_tenants=4)
    text = metrics.render({"remote": EngineSnapshot(0, 0, 0.0, 0, 0, 0, spec_decode=summed)},
                          include_tenants=True).decode()  # fmt: skip
    assert _series(text, ACCEPTED) == {'{model_name="remote"}': 29.0}
    assert _per_pos(text, "remote") == [10, 8, 6, 5]
