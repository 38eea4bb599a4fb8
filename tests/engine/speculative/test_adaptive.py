"""Adaptive draft length per sequence, and the measured batch gate."""

from __future__ import annotations

from engine.speculative.adaptive import FIRST_PAUSE_STEPS, MIN_VERIFIES, AdaptiveK
from engine.speculative.batch_gate import EXPLORE_EVERY, MIN_SAMPLES, BatchGate


def test_k_shrinks_with_rejections_and_grows_back() -> None:
    adaptive = AdaptiveK(4)
    assert adaptive.k_for("s", 1) == 4
    adaptive.observe("s", 4, 1, 1)
    assert adaptive.k_for("s", 2) == 2  # one past what was taken
    adaptive.observe("s", 2, 2, 2)
    assert adaptive.k_for("s", 3) == 3
    adaptive.observe("s", 3, 3, 3)
    adaptive.observe("s", 4, 4, 4)
    assert adaptive.k_for("s", 5) == 4  # never past the configured k


def test_a_sequence_below_the_floor_stops_then_probes_with_longer_pauses() -> None:
    adaptive = AdaptiveK(4)
    step = 0
    for step in range(1, MIN_VERIFIES + 1):
        adaptive.observe("s", 2, 0, step)
    assert adaptive.k_for("s", step + 1) == 0
    assert adaptive.k_for("s", step + FIRST_PAUSE_STEPS) == 1  # probes again, small
    restart = step + FIRST_PAUSE_STEPS
    for i in range(MIN_VERIFIES):
        adaptive.observe("s", 1, 0, restart + i)
    last = restart + MIN_VERIFIES - 1
    assert adaptive.k_for("s", last + FIRST_PAUSE_STEPS) == 0  # the second pause is longer
    assert adaptive.k_for("s", last + 2 * FIRST_PAUSE_STEPS) == 1
    adaptive.release("s")
    assert len(adaptive) == 0


def test_a_sequence_that_keeps_accepting_is_never_paused() -> None:
    adaptive = AdaptiveK(3)
    for step in range(100):
        adaptive.observe("s", 3, 2 + step % 2, step)
        assert adaptive.k_for("s", step + 1) >= 1


def test_a_fixed_bound_replaces_the_measurement() -> None:
    gate = BatchGate(4)
    assert gate.allows(1) and gate.allows(4)
    assert not gate.allows(5)
    assert not gate.allows(0)


def _train(
    gate: BatchGate, rows: int, spec_rate: float, plain_rate: float, steps: int
) -> list[bool]:
    choices = []
    for _ in range(steps):
        drafted = gate.allows(rows)
        choices.append(drafted)
        gate.observe(rows, drafted, int(spec_rate if drafted else plain_rate), 1.0)
    return choices


def test_the_gate_speculates_where_drafts_measure_faster() -> None:
    gate = BatchGate(None)
    choices = _train(gate, 1, spec_rate=30, plain_rate=10, steps=200)
    assert choices[: 2 * MIN_SAMPLES].count(True) == MIN_SAMPLES  # both arms measured first
    later = choices[2 * MIN_SAMPLES :]
    assert later.count(False) <= len(later) // EXPLORE_EVERY + 1  # only exploring
    assert gate.pays(1) is True


def test_the_gate_turns_drafts_off_where_they_cost_more_per_batch_size() -> None:
    gate = BatchGate(None)
    _train(gate, 1, spec_rate=30, plain_rate=10, steps=100)
    choices = _train(gate, 12, spec_rate=50, plain_rate=80, steps=200)
    later = choices[2 * MIN_SAMPLES :]
    assert later.count(True) <= len(later) // EXPLORE_EVERY + 1
    assert gate.pays(12) is False and gate.pays(8) is False  # one bucket: 8..15
    assert gate.pays(1) is True  # the small batch keeps its own figure
    assert gate.pays(40) is None  # never measured


def test_the_gate_notices_a_changed_workload() -> None:
    gate = BatchGate(None)
    _train(gate, 2, spec_rate=30, plain_rate=10, steps=100)
    choices = _train(gate, 2, spec_rate=5, plain_rate=10, steps=300)
    assert gate.pays(2) is False
    assert choices[-50:].count(True) <= 50 // EXPLORE_EVERY + 1
