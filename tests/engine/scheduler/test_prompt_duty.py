"""A tenant's prompt chunks beside other tenants' decodes take at most a share of their
steps' time (engine/scheduler/prompt_duty.py). Step times are synthetic (a fixed decode
part plus a cost per prompt token), fed back as the engine feeds the measured ones."""

from __future__ import annotations

import statistics

import pytest

from engine.scheduler.output import SchedulerOutput
from engine.scheduler.prompt_duty import CONTENDED_PROMPT_SHARE, PromptDuty
from tests.engine.scheduler.test_step_budget import DECODE_S, synthetic_cost, warm_up
from tests.utils.scheduler_driver import Driver


def test_a_chunk_rests_as_many_steps_as_its_cost_over_the_share() -> None:
    duty = PromptDuty(share=0.25)
    # 20 ms of prompt beside a 40 ms decode step: 0.5 of a decode step, 2 steps owed.
    duty.observe({"flood": 16}, 16, 0.020, 0.040)
    assert duty.resting() == {"flood"}
    duty.observe({}, 0, 0.0, 0.040)
    assert duty.resting() == {"flood"}
    duty.observe({}, 0, 0.0, 0.040)
    assert duty.resting() == set()


def test_the_cost_is_shared_by_tokens_and_credit_is_capped_at_one_step() -> None:
    duty = PromptDuty(share=0.5)
    # 30 ms beyond the decodes, 3/4 of the tokens the flood's: 22.5 ms = 1.125 steps.
    duty.observe({"flood": 24}, 32, 0.030, 0.040)
    assert duty.resting() == {"flood"}
    duty.observe({}, 0, 0.0, 0.040)  # 0.125 owed
    assert duty.resting() == {"flood"}
    for _ in range(10):  # idle: at most one step of credit is kept, then forgotten
        duty.observe({}, 0, 0.0, 0.040)
    assert duty.resting() == set()
    duty.observe({"flood": 16}, 16, 0.020, 0.040)  # 1 step owed, none banked
    assert duty.resting() == {"flood"}


def test_without_a_measured_decode_step_a_chunk_rests_one_step() -> None:
    duty = PromptDuty()
    duty.observe({"flood": 64}, 64, None, None)
    assert duty.resting() == {"flood"}
    duty.observe({}, 0, None, None)
    assert duty.resting() == set()


def test_a_stalled_step_charges_at_most_one_decode_step() -> None:
    """A chunk in a step that a pause stretched to a second, beside 2 ms decodes, owes
    what a chunk as costly as the decodes would (4 steps at a quarter), not 2,000."""
    duty = PromptDuty(share=0.25)
    duty.observe({"b": 8}, 8, 1.0, 0.002)
    for _ in range(4):
        assert duty.resting() == {"b"}
        duty.observe({}, 0, 0.0, 0.002)
    assert duty.resting() == set()


@pytest.mark.parametrize("share", [0.0, -1.0])
def test_the_share_must_be_positive(share: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        PromptDuty(share=share)


def _flood_beside_a_decoder(d: Driver) -> list[SchedulerOutput]:
    """A tenant decoding 40 tokens while another keeps four long prompts in flight;
    the steps that carried the victim's decode rows."""
    warm_up(d)
    victim = d.add([3, 4, 5, 6], max_tokens=40, domain="victim")
    flood = [d.add([9 + i] * 256, max_tokens=1, domain="flood") for i in range(4)]
    steps = []
    while not victim.is_finished:
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
        if any(i.seq is victim and i.num_new_tokens == 1 for i in out.scheduled):
            steps.append(out)
    for _ in range(10_000):
        if not d.scheduler.has_unfinished():
            break
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
    assert all(s.is_finished for s in flood), "the flood starved"
    return steps


def test_a_flood_of_prompts_rides_in_a_share_of_a_decoding_tenants_steps() -> None:
    """Without the duty every one of the victim's steps carries a chunk of the flood
    (half a decode step each), and its median step is 1.5 decode steps."""
    d = Driver.make(num_blocks=4096, max_num_batched_tokens=2048, itl_budget_ms=200)
    steps = _flood_beside_a_decoder(d)
    times = [synthetic_cost(out) for out in steps]
    assert statistics.median(times) == pytest.approx(DECODE_S)
    assert statistics.fmean(times) <= DECODE_S * (1 + CONTENDED_PROMPT_SHARE) + 1e-9
    assert any(t > DECODE_S for t in times), "the flood never advanced beside the decodes"


def test_a_tenant_alone_is_never_held() -> None:
    """Once nobody else decodes, the flood's prompts run every step, whatever it still
    owes: holding them would leave steps empty."""
    d = Driver.make(num_blocks=4096, max_num_batched_tokens=2048, itl_budget_ms=200)
    warm_up(d)
    victim = d.add([3, 4, 5, 6], max_tokens=12, domain="victim")
    flood = [d.add([9 + i] * 256, max_tokens=1, domain="flood") for i in range(4)]
    while not victim.is_finished:
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
    assert d.scheduler.prompt_duty.resting() == {"flood"}, "set up: the flood owes steps"
    while d.scheduler.has_unfinished():
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
        assert any(i.num_prompt_tokens for i in out.scheduled), "an empty step"
    assert all(s.is_finished for s in flood)


def test_prompts_beside_batch_decodes_only_owe_nothing() -> None:
    """Batch work (service_tier flex) runs in the capacity interactive work leaves: an
    interactive tenant's prompts beside nothing but batch decodes are never held."""
    d = Driver.make(num_blocks=4096, max_num_batched_tokens=2048, itl_budget_ms=200)
    warm_up(d)
    lines = d.add([3, 4, 5, 6], max_tokens=200, domain="batch", batch=True)
    while lines.num_computed_tokens < len(lines.prompt_token_ids):  # decoding from here on
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
    prompts = [d.add([9 + i] * 256, max_tokens=1, domain="interactive") for i in range(4)]
    while not all(s.is_finished for s in prompts):
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
        assert any(i.seq in prompts for i in out.scheduled), "an interactive prompt was held"
        assert d.scheduler.prompt_duty.resting() == set()
    assert not lines.is_finished, "set up: the batch line decoded beside them throughout"
