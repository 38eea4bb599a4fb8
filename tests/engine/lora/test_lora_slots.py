"""AdapterSlots' bookkeeping: idle reuse, and slots that rotate between steps when more
adapters have work than there are slots."""

from __future__ import annotations

import pytest

from engine.lora.slots import AdapterSlots


def _full(quantum: int = 2) -> AdapterSlots:
    """Two slots, pinned by a (seq a1) and b (seq b1) at step 1."""
    slots = AdapterSlots(2, quantum=quantum)
    slots.begin_step(set())
    for name in "ab":
        assert slots.place(name) is not None
        slots.pin(f"{name}1", name)
    return slots


def test_an_idle_slot_is_reused_least_recently_used_first() -> None:
    slots = _full()
    assert slots.place("c") is None
    slots.release("b1", "b")
    slots.release("a1", "a")
    slots.begin_step({"c"})
    assert slots.resident == {"a": 0, "c": 1}  # b went idle first
    slots.check_integrity()


def test_mid_step_only_a_free_or_idle_slot_is_given() -> None:
    slots = _full(quantum=1)
    assert slots.place("c") is None  # a and b are pinned: no rotation inside a step
    assert slots.resident == {"a": 0, "b": 1}
    slots.release("a1", "a")
    slots.begin_step({"c"})
    assert slots.resident == {"c": 0, "b": 1}


def test_a_resident_gives_way_after_its_quantum_and_then_waits_its_turn() -> None:
    slots = _full(quantum=2)
    assert slots.place("c") is None
    slots.begin_step({"a", "b", "c"})  # step 2: a has held its slot 1 step of 2
    assert slots.slot("c") is None
    slots.begin_step({"a", "b", "c"})  # step 3: a's quantum is over, c takes its slot
    assert slots.resident == {"c": 0, "b": 1}
    assert slots.wanting == ("a",)  # a's sequences pause; a is next in line
    assert slots.in_use("a")
    slots.pin("c1", "c")
    slots.begin_step({"a", "b", "c"})  # step 4: b held its slot since step 1
    assert slots.resident == {"c": 0, "a": 1}
    assert slots.wanting == ("b",)
    assert slots.take_loads() == [(0, "c"), (1, "a")]
    slots.check_integrity()


def test_one_rotated_out_is_not_given_a_slot_back_in_the_same_step() -> None:
    slots = _full(quantum=1)
    assert slots.place("c") is None
    slots.begin_step({"a", "b", "c"})
    assert slots.resident == {"c": 0, "b": 1}  # b keeps its slot: a does not bounce back
    assert slots.wanting == ("a",)
    slots.check_integrity()


def test_no_rotation_without_someone_waiting() -> None:
    slots = _full(quantum=1)
    assert sorted(slots.take_loads()) == [(0, "a"), (1, "b")]
    for _ in range(5):
        slots.begin_step({"a", "b"})
    assert slots.resident == {"a": 0, "b": 1}
    assert slots.take_loads() == []


def test_a_waiting_adapter_whose_requests_ended_leaves_the_line() -> None:
    slots = _full(quantum=1)
    assert slots.place("c") is None
    slots.begin_step({"a", "b"})  # c's request was aborted
    assert slots.wanting == ()
    assert slots.resident == {"a": 0, "b": 1}


def test_a_slot_given_this_step_is_not_taken_by_another_before_it_is_used() -> None:
    slots = AdapterSlots(1, quantum=1)
    slots.begin_step(set())
    assert slots.place("a") == 0  # given, not pinned yet (admission may stop on budget)
    assert slots.place("b") is None
    assert slots.resident == {"a": 0}


def test_unloading_frees_the_slot_and_an_adapter_in_use_cannot_be_dropped() -> None:
    slots = _full()
    with pytest.raises(RuntimeError, match="in use"):
        slots.drop("a")
    slots.release("a1", "a")
    slots.drop("a")
    assert slots.place("d") == 0
    slots.check_integrity()


def test_the_quantum_is_at_least_one_step() -> None:
    with pytest.raises(ValueError, match="quantum"):
        AdapterSlots(2, quantum=0)
