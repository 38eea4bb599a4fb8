"""Overlap scheduling (engine/overlap.py): step N+1 is scheduled and prepared while step
N's forward pass runs, and N's tokens are taken while N+1's runs.

Each test runs the same requests on an engine with overlap and on one without, and
the outputs must be the same token for token: greedy and seeded rows, prefix-cache
hits, stop tokens met while the next step is already in flight, preemptions of
sequences whose token is still pending, aborts, rows that must run synchronously and
a step whose forward pass fails.
"""

from __future__ import annotations

import pathlib
import threading
import time
from typing import Any

import pytest

from engine.engine_builder import build_config
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.sequence import PENDING_TOKEN
from engine.structured.spec import StructuredSpec
from tests.utils.faulty_engine import POISON_SEED, inject_fault

# Overlap whatever the tiny model's forward pass measures (it is near the least on a fast
# machine), so that these tests see launched steps wherever they run.
OPTIONS: dict[str, Any] = {
    "num_blocks": 64,
    "attention_backend": "torch",
    "max_model_len": 128,
    "overlap_min_forward_ms": 0.0,
}
# The tiny random model's distribution is so peaked that a usual temperature samples its
# argmax whatever the draw; at this one a seeded row's tokens follow its draws.
HOT = 20.0
SHARED = [17, 18, 19, 20] * 6  # a prefix two requests share (prefix-cache hits)

Outputs = dict[str, list[tuple[list[int], str | None]]]


def make_engine(model: pathlib.Path, overlap: bool, **options: Any) -> LLMEngine:
    """A tiny engine that keeps its finished requests, with or without overlap."""
    config = build_config(str(model), overlap_scheduling=overlap, **{**OPTIONS, **options})
    return LLMEngine(config, keep_finished=True)


def requests(stop_token: int | None = None) -> list[EngineRequest]:
    """Greedy and seeded rows of several lengths, a shared prefix and an n=2 request."""
    stop = () if stop_token is None else (stop_token,)
    specs: list[tuple[list[int], SamplingParams]] = [
        ([11, 12, 13, 14, 15], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=stop)),
        (SHARED + [1, 2], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)),
        (SHARED + [3], SamplingParams(temperature=HOT, seed=5, max_tokens=14, ignore_eos=True)),
        ([41, 42] * 20, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=stop)),
        ([7, 8, 9], SamplingParams(n=2, temperature=HOT, seed=3, max_tokens=11, ignore_eos=True)),
        ([5] * 33, SamplingParams(temperature=HOT, top_p=0.9, seed=9, max_tokens=25)),
    ]
    return [
        EngineRequest(prompt_token_ids=tuple(p), params=s, request_id=f"r{i}")
        for i, (p, s) in enumerate(specs)
    ]


def run(engine: LLMEngine, reqs: list[EngineRequest]) -> Outputs:
    """Runs `reqs` (queued together) to the end; each request's samples and reasons."""
    for request in reqs:
        engine.add_request(request)
    while engine.has_unfinished():
        engine.step()
    return {
        rid: [(list(s.output_token_ids), s.finish_reason) for s in state.seqs]
        for rid, state in engine.finished.items()
    }


def assert_clean(engine: LLMEngine) -> None:
    """Nothing left behind: blocks, block-table rows, generators, placeholders."""
    assert not engine.has_unfinished()
    assert engine.kv.pool.num_free == engine.kv.num_blocks
    engine.kv.check_integrity()
    assert engine.runner.block_table.num_live_rows == 0
    assert not engine.runner._generators
    for state in engine.finished.values():
        for seq in state.seqs:
            assert PENDING_TOKEN not in seq.output_token_ids


def test_outputs_match_the_synchronous_engine(tiny_model: pathlib.Path) -> None:
    sync = run(make_engine(tiny_model, overlap=False), requests())
    # A stop token the synchronous run meets mid-way: with overlap the next step is
    # already in flight when it is met, and its row for that sequence is dropped.
    stop = sync["r0"][0][0][3]
    sync = run(make_engine(tiny_model, overlap=False), requests(stop))
    engine = make_engine(tiny_model, overlap=True)
    assert engine.overlap is not None
    assert run(engine, requests(stop)) == sync
    assert sync["r0"][0][1] == "stop"
    assert engine.overlap.counters.overlapped_steps > 10
    assert engine.overlap.counters.synchronous_steps == 0
    assert engine.overlap.counters.recovered_steps == 0  # no launched step failed
    assert engine.stats().num_generated_tokens == sum(
        len(tokens) for samples in sync.values() for tokens, _ in samples
    )
    assert_clean(engine)


def test_preempted_sequences_with_a_token_in_flight_match(tiny_model: pathlib.Path) -> None:
    # A pool too small for all of them: sequences are preempted while a step that
    # samples their next token is in flight; they drop it and recompute it.
    reqs = [
        EngineRequest(
            prompt_token_ids=tuple(range(10 + i, 30 + i)),
            params=SamplingParams(
                temperature=0 if i % 2 else HOT, seed=i, max_tokens=40, ignore_eos=True
            ),
            request_id=f"p{i}",
        )
        for i in range(6)
    ]
    sync_engine = make_engine(tiny_model, overlap=False, num_blocks=14, block_size=8)
    sync = run(sync_engine, reqs)
    engine = make_engine(tiny_model, overlap=True, num_blocks=14, block_size=8)
    assert run(engine, reqs) == sync
    assert engine.scheduler.num_preemptions > 0
    assert_clean(engine)


def test_the_next_step_is_prepared_while_the_forward_pass_runs(tiny_model: pathlib.Path) -> None:
    engine = make_engine(tiny_model, overlap=True)
    forwards: list[tuple[float, float]] = []
    prepares: list[float] = []
    real_forward, real_prepare = engine.runner._forward, engine.runner.prepare

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        time.sleep(0.05)  # a forward pass long enough to see what overlaps it
        out = real_forward(*args, **kwargs)
        forwards.append((began, time.perf_counter()))
        return out

    def prepare(output: Any) -> Any:
        prepares.append(time.perf_counter())
        return real_prepare(output)

    engine.runner._forward = slow_forward  # type: ignore[method-assign]
    engine.runner.prepare = prepare  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    run(engine, [EngineRequest(prompt_token_ids=(3, 4, 5), params=params)])
    assert len(forwards) == len(prepares) == 6
    # Step k+1 was scheduled and its inputs built before step k's forward pass ended (in
    # turn, it would be after). Not before step k was: steps are launched in order.
    for k in range(5):
        assert prepares[k] < prepares[k + 1] < forwards[k][1], (k, forwards, prepares)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "in-turn"])
def test_a_streaming_front_gets_each_token_while_the_next_step_runs(
    tiny_model: pathlib.Path, overlap: bool
) -> None:
    """Through the engine loop, step k's token reaches the front before step k+1's
    forward pass ends (overlap: during it, from the host thread), not a step late."""
    from engine.fronts.core_loop import STOP, AddRequest, EngineLoop, StepReport

    engine = make_engine(tiny_model, overlap=overlap)
    forwards: list[float] = []  # when each forward pass ended
    real_forward = engine.runner._forward

    def slow_forward(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        out = real_forward(*args, **kwargs)
        forwards.append(time.perf_counter())
        return out

    engine.runner._forward = slow_forward  # type: ignore[method-assign]
    arrivals: list[float] = []  # when each token reached the front

    def sink(report: StepReport) -> None:
        now = time.perf_counter()
        arrivals.extend(now for e in report.events for d in e.deltas for _ in d.token_ids)

    loop = EngineLoop(engine, sink)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    loop.put(AddRequest(EngineRequest(prompt_token_ids=(3, 4, 5), params=params), 6))
    serving = threading.Thread(target=loop.run)
    serving.start()
    deadline = time.monotonic() + 30
    while len(arrivals) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.put(STOP)
    serving.join(timeout=30)
    assert len(forwards) == len(arrivals) == 6
    for k in range(5):
        assert forwards[k] < arrivals[k] < forwards[k + 1], (k, forwards, arrivals)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, logit_bias=((21, 5.0),), max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, min_tokens=8, max_tokens=12),
        SamplingParams(
            temperature=0,
            max_tokens=12,
            structured=StructuredSpec(kind="regex", value="[ab]{3,}"),
        ),
    ],
    ids=["penalty", "logit_bias", "min_tokens", "grammar"],
)
def test_rows_that_need_the_previous_token_run_in_turn(
    tiny_model: pathlib.Path, params: SamplingParams
) -> None:
    def reqs() -> list[EngineRequest]:
        plain = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
        return [
            EngineRequest(prompt_token_ids=(31, 32, 33), params=params, request_id="needs"),
            EngineRequest(prompt_token_ids=(51, 52), params=plain, request_id="plain"),
        ]

    sync = run(make_engine(tiny_model, overlap=False), reqs())
    engine = make_engine(tiny_model, overlap=True)
    assert run(engine, reqs()) == sync
    assert engine.overlap is not None and engine.overlap.counters.synchronous_steps > 0
    assert_clean(engine)


def test_an_abort_while_a_step_is_in_flight_leaves_no_placeholder(
    tiny_model: pathlib.Path,
) -> None:
    engine = make_engine(tiny_model, overlap=True)
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    rid = engine.add_request(EngineRequest(prompt_token_ids=(9, 8, 7, 6), params=params))
    for _ in range(4):
        engine.step()
    (seq,) = engine.requests[rid].seqs
    assert seq.has_pending_token  # the step launched last samples it
    event = engine.abort(rid)
    assert event is not None and event.finished
    assert PENDING_TOKEN not in event.deltas[0].token_ids
    assert seq.output_token_ids == [t for t in seq.output_token_ids if t >= 0]
    engine.step()  # runs the step launched next, which still has the aborted row
    assert engine.overlap is not None
    engine.overlap.drain()  # takes it: the aborted row's token is dropped
    assert not engine.has_unfinished()
    assert engine.finished[rid].seqs[0].output_token_ids == seq.output_token_ids
    assert_clean(engine)


def test_a_step_that_fails_in_flight_is_run_again_and_fails_its_request_alone(
    tiny_model: pathlib.Path,
) -> None:
    def reqs() -> list[EngineRequest]:
        good = requests()[:4]
        poison = SamplingParams(temperature=0, seed=POISON_SEED, max_tokens=12, ignore_eos=True)
        return [*good, EngineRequest(prompt_token_ids=(2, 3), params=poison, request_id="bad")]

    sync = run(make_engine(tiny_model, overlap=False), requests()[:4])
    engine = inject_fault(make_engine(tiny_model, overlap=True), "runner")
    out = run(engine, reqs())
    failed = [rid for rid, _ in engine.take_failures()]
    assert failed == ["bad"]
    assert {rid: out[rid] for rid in sync} == sync
    assert engine.overlap is not None and engine.overlap.counters.recovered_steps >= 1
    assert_clean(engine)


def test_overlap_is_off_when_asked_or_with_speculation(tiny_model: pathlib.Path) -> None:
    assert make_engine(tiny_model, overlap=False).overlap is None
    speculating = make_engine(tiny_model, overlap=True, speculative_method="ngram")
    assert speculating.overlap is None


def test_steps_run_in_turn_while_the_forward_pass_is_shorter_than_the_least(
    tiny_model: pathlib.Path,
) -> None:
    """Nothing to hide the host's work behind: once a forward pass has been measured
    under `overlap_min_forward_ms`, steps run in turn (the same tokens); before that,
    at most the first two are launched ahead."""
    sync = run(make_engine(tiny_model, overlap=False), requests())
    engine = make_engine(tiny_model, overlap=True, overlap_min_forward_ms=10_000.0)
    assert run(engine, requests()) == sync
    assert engine.overlap is not None and engine.runner.forward_s is not None
    assert engine.runner.forward_s < 10.0
    assert engine.overlap.counters.overlapped_steps <= 2
    assert engine.overlap.counters.synchronous_steps > 10
    assert_clean(engine)


def test_a_forward_pass_that_grows_past_the_least_turns_overlap_on(
    tiny_model: pathlib.Path,
) -> None:
    """The measure follows the model: short forward passes run in turn, and once they
    take longer than the least (a bigger batch, a slower device) steps launch ahead
    again, with the same tokens as in turn."""
    engine = make_engine(tiny_model, overlap=True, overlap_min_forward_ms=200.0)
    assert engine.overlap is not None
    counters = engine.overlap.counters
    real_forward = engine.runner._forward
    slow = threading.Event()

    def forward(*args: Any, **kwargs: Any) -> Any:
        if slow.is_set():
            time.sleep(0.3)
        return real_forward(*args, **kwargs)

    engine.runner._forward = forward  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    request = EngineRequest(prompt_token_ids=(3, 4, 5), params=params, request_id="r")
    engine.add_request(request)
    for _ in range(10):
        engine.step()
    in_turn = counters.synchronous_steps
    assert in_turn >= 7 and counters.overlapped_steps <= 2  # the tiny model is fast
    slow.set()
    while engine.has_unfinished():
        engine.step()
    assert counters.overlapped_steps >= 5  # launched ahead once measured slow
    sync = run(make_engine(tiny_model, overlap=False), [request])
    assert [(list(s.output_token_ids), s.finish_reason) for s in engine.finished["r"].seqs] == (
        sync["r"]
    )
    assert_clean(engine)


def test_the_least_is_a_setting_that_reaches_the_engine_and_refuses_bad_values(
    tiny_model: pathlib.Path,
) -> None:
    from pydantic import ValidationError

    from assembly.engine_options import serve_engine_options
    from server.settings import Settings

    settings = Settings(overlap_min_forward_ms=2.5)
    config = build_config("m", **serve_engine_options(settings))
    assert config.scheduler.overlap_min_forward_ms == 2.5
    assert build_config("m").scheduler.overlap_min_forward_ms == 1.0  # the default
    for bad in (-1.0, "soon", float("nan")):
        with pytest.raises(ValidationError):
            Settings(overlap_min_forward_ms=bad)
        with pytest.raises(ValueError, match="overlap_min_forward_ms"):
            build_config("m", overlap_min_forward_ms=bad)
