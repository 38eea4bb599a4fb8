"""The ITL budget: each step's prompt tokens capped from measured step costs (seed §7)."""

from __future__ import annotations

import pytest

from engine.scheduler.output import SchedulerOutput
from engine.scheduler.step_budget import MIN_PREFILL_TOKENS, WINDOW, StepBudget
from tests.utils.scheduler_driver import Driver

DECODE_S = 0.040  # a step's fixed part in the synthetic cost below
PER_TOKEN_S = 0.001  # and its cost per prompt token


def synthetic_cost(out: SchedulerOutput) -> float:
    """A step's wall time on a pretend machine: fixed part plus a cost per prompt token."""
    prefill = sum(i.num_new_tokens for i in out.scheduled if i.num_new_tokens > 1)
    return DECODE_S + PER_TOKEN_S * prefill


def test_no_budget_never_caps() -> None:
    budget = StepBudget(None, 2048)
    for _ in range(5):
        budget.observe(500, 8, 2.0)
    assert not budget.enabled
    assert budget.prefill_cap() == 2048
    assert budget.estimates() == (None, None)


def test_cap_is_what_fits_the_budget_after_decodes() -> None:
    budget = StepBudget(0.100, 2048)
    assert budget.prefill_cap() == 2048  # nothing measured yet
    for _ in range(4):
        budget.observe(0, 8, DECODE_S)
        budget.observe(200, 8, DECODE_S + 200 * PER_TOKEN_S)
    decode, per_token = budget.estimates()
    assert decode == pytest.approx(DECODE_S)
    assert per_token == pytest.approx(PER_TOKEN_S)
    assert budget.prefill_cap() == 60  # (100 - 40) ms at 1 ms a token


def test_a_slow_first_step_moves_the_estimate_little() -> None:
    budget = StepBudget(0.100, 2048)
    budget.observe(0, 8, 3.0)  # a compile or a page-in on the first decode
    budget.observe(400, 0, 9.0)
    for _ in range(6):
        budget.observe(0, 8, DECODE_S)
        budget.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    assert budget.prefill_cap() == 60


def test_cap_never_below_the_floors_nor_above_the_token_budget() -> None:
    tight = StepBudget(0.010, 2048)  # decodes alone take 40 ms
    loose = StepBudget(60.0, 512)
    for b in (tight, loose):
        b.observe(0, 8, DECODE_S)
        b.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    # As many prompt tokens as cost what the decodes do: prompts get half of a step.
    assert tight.prefill_cap() == 40
    assert loose.prefill_cap() == 512
    cheap_decodes = StepBudget(0.001, 2048)
    cheap_decodes.observe(0, 1, 0.002)
    cheap_decodes.observe(100, 1, 0.002 + 100 * PER_TOKEN_S)
    assert cheap_decodes.prefill_cap() == MIN_PREFILL_TOKENS


def test_small_prefills_are_not_sampled() -> None:
    budget = StepBudget(0.100, 2048)
    budget.observe(MIN_PREFILL_TOKENS - 1, 8, 5.0)  # says little about a token's cost
    assert budget.estimates()[1] is None
    assert budget.prefill_cap() == 2048


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_budget_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        StepBudget(bad, 2048)


def run_with_costs(d: Driver, max_steps: int = 10_000) -> list[float]:
    """Steps `d` to the end, feeding each step's synthetic wall time back to the budget."""
    times = []
    for _ in range(max_steps):
        if not d.scheduler.has_unfinished():
            return times
        out = d.step()
        elapsed = synthetic_cost(out)
        d.scheduler.observe_step(out, elapsed)
        times.append(elapsed)
    raise AssertionError("scheduler did not finish")


def warm_up(d: Driver) -> None:
    """Two requests that let the budget measure both costs: a decode, then a prompt
    prefilled beside it."""
    d.add([1, 2, 3, 4], max_tokens=12)  # too short a prompt to be sampled
    for _ in range(3):
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
    d.add(list(range(1, 41)), max_tokens=4)
    run_with_costs(d)


def test_scheduler_keeps_every_step_within_the_budget_once_measured() -> None:
    d = Driver.make(num_blocks=2048, max_num_batched_tokens=2048, itl_budget_ms=100)
    warm_up(d)
    cap = d.scheduler.step_budget.prefill_cap()
    assert cap == 60
    # A burst of eight 200-token prompts, arriving together.
    burst = [d.add([7 + i] * 200, max_tokens=16) for i in range(8)]
    first_token_step: dict[str, int] = {}
    while d.scheduler.has_unfinished():
        out = d.step()
        elapsed = synthetic_cost(out)
        d.scheduler.observe_step(out, elapsed)
        assert elapsed <= 0.100 + 1e-9
        prefill = sum(i.num_new_tokens for i in out.scheduled if i.num_new_tokens > 1)
        assert prefill <= cap
        for seq in burst:
            if seq.output_token_ids and seq.seq_id not in first_token_step:
                first_token_step[seq.seq_id] = len(d.steps)
            # Decodes are never held back: once a sequence has a token, it gets one a step.
            if seq.output_token_ids and not seq.is_finished:
                assert len(seq.output_token_ids) == len(d.steps) - first_token_step[seq.seq_id] + 1
    assert all(len(seq.output_token_ids) == 16 for seq in burst)
    # The burst's first tokens come at different steps: the next round arrives spread out.
    assert len(set(first_token_step.values())) == len(burst)


def test_without_a_budget_a_burst_prefills_in_one_step() -> None:
    d = Driver.make(num_blocks=2048, max_num_batched_tokens=2048)
    warm_up(d)
    warm = len(d.steps)
    for i in range(8):
        d.add([7 + i] * 200, max_tokens=16)
    run_with_costs(d)
    assert d.steps[warm].num_batched_tokens == 1600
    assert d.scheduler.step_budget.prefill_cap() == 2048


def test_a_long_prompt_still_gets_half_a_step_when_decodes_fill_the_budget() -> None:
    d = Driver.make(num_blocks=2048, max_num_batched_tokens=2048, itl_budget_ms=10)
    warm_up(d)
    d.add(list(range(1, 5)), max_tokens=40)  # a decode that runs beside the prompt
    for _ in range(2):
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
    long = d.add([3] * 100, max_tokens=2)
    run_with_costs(d)
    chunks = [s.num_new_tokens for out in d.steps for s in out.scheduled if s.seq is long]
    # Decodes alone take 40 ms, over the 10 ms budget: prompts get 40 tokens at 1 ms each.
    assert chunks[:2] == [40, 40]
    assert long.finish_reason == "length"


def test_the_contended_cap_is_what_the_decodes_cost() -> None:
    """While several tenants have work a step carries as many prompt tokens as its
    decodes cost (each tenant's next token waits on others' prompts for about one
    decode step); unmeasured or without a budget, the usual cap."""
    budget = StepBudget(0.200, 2048)
    assert budget.contended_cap() == 2048  # nothing measured yet
    budget.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    assert budget.contended_cap() == budget.prefill_cap()  # no decode figure yet
    for _ in range(4):
        budget.observe(0, 8, DECODE_S)
        budget.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    assert budget.prefill_cap() == 160  # (200 - 40) ms at 1 ms a token
    assert budget.contended_cap() == 40  # 40 ms of decodes at 1 ms a token
    tight = StepBudget(0.001, 30)
    tight.observe(0, 8, DECODE_S)
    tight.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    assert tight.contended_cap() == 30  # never above the usual cap
    unbudgeted = StepBudget(None, 2048)
    unbudgeted.observe(0, 8, DECODE_S)
    unbudgeted.observe(100, 8, DECODE_S + 100 * PER_TOKEN_S)
    assert unbudgeted.contended_cap() == 2048


def test_while_a_tenant_decodes_another_tenants_prompts_get_its_part_of_the_contended_cap() -> None:
    """A flood of long prompts beside a tenant that decodes: every step carries at most
    the flood's part of the contended cap (half of what the decodes cost), so the other
    tenant's steps stay near a decode step's time instead of the whole ITL budget."""
    d = Driver.make(num_blocks=4096, max_num_batched_tokens=2048, itl_budget_ms=200)
    warm_up(d)
    assert d.scheduler.step_budget.contended_cap() == 40
    victim = d.add([3, 4, 5, 6], max_tokens=30, domain="victim")
    flood = [d.add([9 + i] * 256, max_tokens=1, domain="flood") for i in range(4)]
    while not victim.is_finished:
        out = d.step()
        d.scheduler.observe_step(out, synthetic_cost(out))
        flood_prompt = sum(i.num_new_tokens for i in out.scheduled if i.seq.fairness_key == "flood")
        assert flood_prompt <= 20
    run_with_costs(d)
    assert all(s.is_finished for s in flood)


def test_decode_costs_are_kept_by_rows_so_a_busy_spell_does_not_set_a_quiet_ones_cap() -> None:
    """After a busy spell (eight decode rows, 125 ms a step), a flood beside one decoding
    tenant takes no decode-only step: its prompt tokens are charged after one row's
    decode (62.5 ms), and the contended cap is what one row costs, not eight."""
    per_token = 2.0**-10  # about 1 ms; powers of two keep the arithmetic exact
    budget = StepBudget(0.200, 2048)
    for _ in range(3):
        budget.observe(0, 1, 0.0625)
    for _ in range(WINDOW):
        budget.observe(0, 8, 0.125)
    for _ in range(WINDOW):  # the flood: one decode row beside 128 prompt tokens
        budget.observe(128, 1, 0.0625 + 128 * per_token)
    assert budget.estimates() == (0.125, per_token)
    assert budget.contended_cap(1) == 64  # 62.5 ms of decodes at about 1 ms a token
    assert budget.contended_cap(8) == 128
    assert budget.contended_cap(2) == 64  # the nearest measured: one row
    assert budget.contended_cap(5) == 128
    assert budget.contended_cap() == 128  # any number of rows: the median of all


def test_the_batch_slack_is_read_off_a_line_through_the_costs_per_row() -> None:
    budget = StepBudget(0.2, 2048)
    assert budget.extra_within(4, 0.1) is None  # nothing measured yet
    for _ in range(4):
        budget.observe(0, 2, 0.050)  # 50 ms with 2 rows, 90 ms with 6: 10 ms a row
        budget.observe(0, 6, 0.090)
        budget.observe(64, 2, 0.050 + 64 * 0.002)  # 2 ms a prompt token
    rows, tokens = budget.extra_within(4, 0.1) or (0, 0)
    # 4 rows cost 70 ms: 10% is 7 ms, no whole row (10 ms) and 3 prompt tokens.
    assert (rows, tokens) == (0, 3)
    rows, tokens = budget.extra_within(10, 0.5) or (0, 0)
    assert (rows, tokens) == (6, 32)  # 130 ms: 65 ms of slack
    row_s, token_s = budget.marginal_costs() or (0.0, 0.0)
    assert (row_s, token_s) == pytest.approx((0.010, 0.002))


def test_marginal_costs_wait_for_two_row_counts_and_a_prompt_chunk() -> None:
    budget = StepBudget(0.2, 2048)
    budget.observe(0, 2, 0.050)
    budget.observe(64, 2, 0.050 + 64 * 0.002)
    assert budget.marginal_costs() is None  # one row count: no slope yet
    budget.observe(0, 6, 0.090)
    assert budget.marginal_costs() == pytest.approx((0.010, 0.002))
