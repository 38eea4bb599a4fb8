"""The per-request histograms' inputs: one outcome per finished sample (issue 19, s. 6)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engine.outputs import CompletionDelta, RequestMetrics, StreamEvent
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop.client import EngineSnapshot
from gateway.metrics import GatewayMetrics
from gateway.request_outcomes import EngineRequestOutcome, OutcomeTracker


def _event(
    rid: str, deltas: list[tuple[int, int, str | None]], metrics: RequestMetrics | None = None
) -> StreamEvent:
    """Deltas as (sample index, new tokens, finish reason)."""
    return StreamEvent(
        rid,
        tuple(CompletionDelta(i, "x" * n, tuple(range(n)), None, r) for i, n, r in deltas),
        (1, 2, 3),
        0,
        metrics is not None,
        metrics,
    )


def test_one_outcome_per_finished_sample_with_its_times() -> None:
    tracker = OutcomeTracker()
    for rid, prompt, n in (("a", (1, 2, 3), 2), ("b", (1, 2), 1)):
        params = SamplingParams(n=n, max_tokens=8)
        tracker.submitted(EngineRequest(prompt_token_ids=prompt, params=params, request_id=rid))
    tracker.observe(_event("a", [(0, 1, None), (1, 2, None)]))
    tracker.observe(_event("b", [(0, 1, None)]))  # never finishes: the client left
    tracker.observe(
        _event("a", [(0, 3, "stop"), (1, 6, "length")], RequestMetrics(10.0, 10.5, 11.0, 13.0))
    )
    assert sorted(tracker.outcomes(), key=lambda o: o.generation_tokens) == [
        EngineRequestOutcome(3, 4, 8, "stop", 0.5, 2.0),
        EngineRequestOutcome(3, 8, 8, "length", 0.5, 2.0),
    ]


def test_outcomes_and_cache_info_become_vllm_series() -> None:
    m = GatewayMetrics(model_name="m", top_tenants=2)
    m.observe_outcomes(
        [
            EngineRequestOutcome(3, 4, 8, "stop", 0.5, 2.0),
            EngineRequestOutcome(5, 8, None, "length", None, None),
        ]
    )
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0, 10, 12, 64, 16))
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0, 25, 30, 64, 16))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(m.render(None).decode())
        for s in family.samples
    }
    m_ = (("model_name", "m"),)
    assert samples[("vllm:prompt_tokens_total", m_)] == 25
    assert samples[("vllm:generation_tokens_total", m_)] == 30
    assert samples[("vllm:request_success_total", (("finished_reason", "stop"), *m_))] == 1
    assert samples[("vllm:request_success_total", (("finished_reason", "length"), *m_))] == 1
    assert samples[("vllm:request_prompt_tokens_sum", m_)] == 8
    assert samples[("vllm:request_generation_tokens_sum", m_)] == 12
    assert samples[("vllm:request_max_num_generation_tokens_count", m_)] == 1
    assert samples[("vllm:request_prefill_time_seconds_sum", m_)] == 0.5
    assert samples[("vllm:request_decode_time_seconds_count", m_)] == 1
    info = (
        ("block_size", "16"), ("cache_dtype", "auto"), ("model_name", "m"),
        ("num_gpu_blocks", "64"),
    )  # fmt: skip
    assert samples[("vllm:cache_config_info", info)] == 1


def test_kv_event_drops_become_a_counter_only_for_an_engine_that_publishes() -> None:
    m = GatewayMetrics(model_name="m", top_tenants=2)
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0), model="quiet")  # publishes nothing
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0, kv_events_dropped=3))
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0, kv_events_dropped=7))
    m.update_engine(EngineSnapshot(0, 0, 0.0, 0, 0, 0, kv_events_dropped=2))  # restarted
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(m.render(None).decode())
        for s in family.samples
    }
    assert samples[("cloister_kv_events_dropped_total", (("model_name", "m"),))] == 9
    assert ("cloister_kv_events_dropped_total", (("model_name", "quiet"),)) not in samples
