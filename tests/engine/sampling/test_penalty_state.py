"""The batched, incremental penalties equal the per-row reference across steps and slot reuse."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling import penalties
from engine.sampling.penalties import apply_all, apply_presence_frequency
from engine.sampling.penalty_state import PenaltyState
from engine.sampling.row import SamplingError, SamplingRow
from engine.sampling.sampler import Sampler
from engine.sampling_params import SamplingParams
from tests.engine.runner.factory import tiny_arch, tiny_engine, tiny_model

VOCAB = 50


# -- the oracle: the per-row code this replaced, kept verbatim in behaviour -----------


def reference_all(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
    """Bias and min_tokens as in the package, then the per-row penalties it used to run."""
    penalties.apply_logit_bias(logits, rows)
    penalties.apply_min_tokens(logits, rows)
    for i, row in enumerate(rows):
        penalty = row.params.repetition_penalty
        history = list(row.prompt_token_ids) + list(row.output_token_ids)
        if penalty == 1.0 or not history:
            continue
        seen = torch.unique(torch.tensor(history))
        values = logits[i, seen]
        logits[i, seen] = torch.where(values > 0, values / penalty, values * penalty)
    for i, row in enumerate(rows):
        presence = row.params.presence_penalty
        frequency = row.params.frequency_penalty
        if (presence == 0.0 and frequency == 0.0) or not row.output_token_ids:
            continue
        tokens, counts = torch.unique(torch.tensor(list(row.output_token_ids)), return_counts=True)
        logits[i, tokens] -= frequency * counts.to(logits.dtype) + presence


PARAMS = [
    SamplingParams(),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.8),
    SamplingParams(presence_penalty=0.7),
    SamplingParams(frequency_penalty=-0.4),
    SamplingParams(presence_penalty=-1.5, frequency_penalty=0.25, repetition_penalty=1.7),
    SamplingParams(presence_penalty=2.0, logit_bias={3: 4.0, 7: -1.0}),
]


class _Seq:
    """A live sequence as the runner sees it: fixed prompt, outputs growing in place."""

    def __init__(self, key: str, params: SamplingParams, prompt: list[int]) -> None:
        self.key, self.params, self.prompt = key, params, prompt
        self.output: list[int] = []

    def row(self) -> SamplingRow:
        return SamplingRow(self.params, None, self.prompt, self.output, state_key=self.key)


def _logits(rng: torch.Generator, rows: int) -> torch.Tensor:
    logits = torch.randn(rows, VOCAB, generator=rng) * 3
    logits[:, 0] = float("-inf")  # a masked token stays masked
    logits[:, 1] = -0.0
    return logits


def _check(state: PenaltyState, rows: Sequence[SamplingRow], rng: torch.Generator) -> None:
    logits = _logits(rng, len(rows))
    expected = logits.clone()
    reference_all(expected, rows)
    apply_all(logits, rows, state)
    assert torch.equal(logits, expected)
    # Bit-exact, -0.0 included.
    assert torch.equal(torch.signbit(logits), torch.signbit(expected))


def _random_prompt(rnd: random.Random) -> list[int]:
    return [rnd.randrange(VOCAB) for _ in range(rnd.randrange(0, 30))]


def test_many_steps_with_finishes_aborts_and_readmissions_match_the_reference() -> None:
    rnd = random.Random(3)
    rng = torch.Generator().manual_seed(3)
    state = PenaltyState(initial_slots=2)  # forces the tables to grow mid-run
    live: list[_Seq] = []
    serial = 0
    for step in range(60):
        while len(live) < 9:
            # n > 1: samples of one request share the prompt list and params.
            params = rnd.choice(PARAMS)
            prompt = _random_prompt(rnd)
            for sample in range(rnd.choice((1, 1, 3))):
                live.append(_Seq(f"r{serial}-{sample}", params, prompt))
            serial += 1
        rnd.shuffle(live)
        _check(state, [seq.row() for seq in live], rng)
        for seq in live:
            seq.output.append(rnd.randrange(VOCAB))
            if rnd.random() < 0.2:
                # Tokens generated on steps whose batch did not need the sampler.
                seq.output.extend(rnd.randrange(VOCAB) for _ in range(3))
        if step % 4 == 3:
            # Finish or abort some: their slots go to the next requests.
            for seq in live[:3]:
                state.release(seq.key)
            live = live[3:]
    assert state.num_live_slots == len({seq.key for seq in live if _uses(seq.params)})


def _uses(params: SamplingParams) -> bool:
    return bool(
        params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
    )


def test_a_preempted_sequence_keeps_or_rebuilds_its_counts() -> None:
    rng = torch.Generator().manual_seed(5)
    state = PenaltyState()
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5)
    seq = _Seq("a", params, [4, 5, 5, 6])
    seq.output.extend([7, 7, 8])
    _check(state, [seq.row()], rng)
    # Preempted and recomputed: same lists, more outputs later.
    seq.output.extend([9, 7])
    _check(state, [seq.row()], rng)
    # Released, then back with the same history (a runner that frees on preemption).
    state.release("a")
    _check(state, [seq.row()], rng)
    # The caller replaced the output list (not the contract, but it must not mis-count).
    seq.output = [8, 8, 8, 2]
    _check(state, [seq.row()], rng)
    # Shrunk in place: rebuilt too.
    del seq.output[1:]
    _check(state, [seq.row()], rng)


def test_a_freed_slot_carries_nothing_to_its_next_owner() -> None:
    rng = torch.Generator().manual_seed(6)
    state = PenaltyState(initial_slots=1)
    old = _Seq("old", SamplingParams(repetition_penalty=2.0, presence_penalty=1.0), [1, 2, 3])
    old.output.extend([4, 4, 5])
    _check(state, [old.row()], rng)
    state.release("old")
    new = _Seq("new", SamplingParams(repetition_penalty=2.0, frequency_penalty=1.0), [9])
    new.output.append(10)
    _check(state, [new.row()], rng)  # the same single slot, zeroed
    assert state.num_live_slots == 1


def test_only_rows_with_penalties_take_slots_and_keyless_rows_keep_none() -> None:
    rng = torch.Generator().manual_seed(7)
    state = PenaltyState()
    rows = [
        SamplingRow(SamplingParams(), None, [1, 2], [3], state_key="plain"),
        SamplingRow(SamplingParams(presence_penalty=1.0), None, [1], [3, 3]),  # no key
        SamplingRow(SamplingParams(repetition_penalty=1.2), None, [2], [4], state_key="rep"),
    ]
    _check(state, rows, rng)
    assert state.num_live_slots == 1
    _check(state, rows, rng)  # the keyless row's throwaway slot was freed and is reused
    assert state.num_live_slots == 1


def test_a_batch_without_penalties_allocates_nothing() -> None:
    sampler = Sampler()
    rows = [SamplingRow(SamplingParams(temperature=0.0, logit_bias={2: 9.0}), None, [1], [2], "k")]
    assert sampler.sample(torch.zeros(1, 8), rows).token_ids == [2]
    assert sampler.penalty_state.num_live_slots == 0
    assert sampler.penalty_state.sync([], [], 8, torch.device("cpu")).counts.shape == (8, 8)


def test_the_same_key_twice_in_a_batch() -> None:
    rng = torch.Generator().manual_seed(8)
    state = PenaltyState()
    seq = _Seq("k", SamplingParams(frequency_penalty=1.0), [1])
    seq.output.extend([2, 2])
    _check(state, [seq.row(), seq.row()], rng)  # same history: counted once
    other = SamplingRow(seq.params, None, [1], [2], state_key="k")
    with pytest.raises(SamplingError, match="share state key"):
        apply_all(torch.zeros(2, VOCAB), [seq.row(), other], state)
    _check(state, [seq.row()], rng)  # forgotten on the error, rebuilt whole


def test_an_out_of_vocabulary_token_is_an_error_and_leaves_no_half_state() -> None:
    rng = torch.Generator().manual_seed(9)
    state = PenaltyState()
    seq = _Seq("k", SamplingParams(presence_penalty=1.0), [1])
    seq.output.append(3)
    _check(state, [seq.row()], rng)
    seq.output.append(VOCAB)
    with pytest.raises(SamplingError, match="outside the vocabulary"):
        apply_presence_frequency(torch.zeros(1, VOCAB), [seq.row()], state)
    seq.output[-1] = 4
    _check(state, [seq.row()], rng)


def test_slots_written_in_inference_mode_are_released_and_reused_outside_it() -> None:
    rng = torch.Generator().manual_seed(10)
    state = PenaltyState(initial_slots=1)
    seq = _Seq("a", SamplingParams(repetition_penalty=1.4), [1, 2])
    with torch.inference_mode():
        _check(state, [seq.row()], rng)
    state.release("a")
    _check(state, [_Seq("b", SamplingParams(repetition_penalty=1.4), [3]).row()], rng)


# -- the engine end to end ------------------------------------------------------------


def _engine() -> LLMEngine:
    arch = tiny_arch()
    model = tiny_model(arch, seed=2)
    # Few blocks: the requests below preempt each other (recompute) on the way.
    options: dict[str, object] = {"block_size": 4, "num_blocks": 26, "attention_backend": "torch"}
    return tiny_engine(arch, model, **options)


def _run_penalised(engine: LLMEngine) -> tuple[list[list[list[int]]], int]:
    requests = [
        ([5, 17, 33, 2, 9, 5, 5], SamplingParams(temperature=0.0, repetition_penalty=1.8)),
        ([100, 7, 7, 7], SamplingParams(temperature=0.0, frequency_penalty=1.5)),
        (list(range(40, 63)), SamplingParams(temperature=0.0, presence_penalty=2.0)),
        (
            [301, 302],
            SamplingParams(
                temperature=0.9,
                seed=4,
                n=3,
                repetition_penalty=1.3,
                presence_penalty=0.5,
                frequency_penalty=0.5,
            ),
        ),
        ([8, 9, 10], SamplingParams(temperature=0.0)),
    ]
    common: dict[str, Any] = {"max_tokens": 16, "ignore_eos": True}
    ids = []
    for prompt, params in requests:
        ids.append(
            engine.add_request(
                EngineRequest(
                    prompt_token_ids=tuple(prompt), params=dataclasses.replace(params, **common)
                )
            )
        )
    aborted = engine.add_request(
        EngineRequest(
            prompt_token_ids=(1, 2, 3),
            params=SamplingParams(temperature=0.0, max_tokens=16, repetition_penalty=2.0),
        )
    )
    preempted = 0
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
        if steps == 3:
            engine.abort(aborted)
            # Re-admitted into the freed slot.
            ids.append(
                engine.add_request(
                    EngineRequest(
                        prompt_token_ids=(1, 2, 3),
                        params=SamplingParams(
                            temperature=0.0, max_tokens=10, repetition_penalty=2.0, ignore_eos=True
                        ),
                    )
                )
            )
        for state in engine.requests.values():
            preempted = max(preempted, *(seq.num_preemptions for seq in state.seqs))
    outputs = [[list(o.token_ids) for o in engine.finished.pop(i).to_output().outputs] for i in ids]
    return outputs, preempted


def test_engine_outputs_with_penalties_equal_the_reference_path() -> None:
    engine = _engine()
    got, preempted = _run_penalised(engine)
    assert preempted > 0  # the recompute path was exercised
    assert engine.runner.sampler.penalty_state.num_live_slots == 0  # all released
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            "engine.sampling.sampler.apply_all",
            lambda logits, rows, state=None: reference_all(logits, rows),
        )
        expected, _ = _run_penalised(_engine())
    assert got == expected
    # The penalties did change greedy output (else this compares nothing).
    plain = _engine()
    rid = plain.add_request(
        EngineRequest(
            prompt_token_ids=(100, 7, 7, 7),
            params=SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        )
    )
    while plain.has_unfinished():
        plain.step()
    assert list(plain.finished.pop(rid).to_output().outputs[0].token_ids) != got[1][0]
