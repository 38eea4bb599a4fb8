"""Adapters in a running engine: mixed batches, the cache key, load/unload, slots, stats."""

from __future__ import annotations

import pytest

from engine.errors import AdapterInUseError, AdapterNotFoundError, InvalidRequestError
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.scheduler.output import SchedulerOutput
from tests.utils.lora_engine import GREEDY, Adapters, make_engine, outputs, run_all

NAMES = ("r4", "r8", "r16", "r8b")


def _prompt(i: int) -> list[int]:
    return [3 + i, 40 + 7 * i, 900 + i, 11, 12 + i, 5000 + 13 * i, 7, 8 + i, 77]


def _load(engine: LLMEngine, adapters: Adapters, names: tuple[str, ...] = NAMES) -> None:
    for name in names:
        engine.load_adapter(name, str(adapters.paths[name]))


def _alone(adapters: Adapters) -> dict[str | None, list[int]]:
    """Each adapter's (and the base's) tokens for its prompt, one request per engine run."""
    engine = make_engine(adapters.model)
    _load(engine, adapters, ("r4", "r8", "r16", "r8b", "r4b"))
    alone: dict[str | None, list[int]] = {}
    for i, name in enumerate((None, "r4", "r8", "r16", "r8b", "r4b")):
        rid = engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(i)), params=GREEDY, adapter=name, cache=False
            )
        )
        run_all(engine)
        alone[name] = outputs(engine, rid)
    return alone


@pytest.fixture(scope="module")
def alone(adapters: Adapters) -> dict[str | None, list[int]]:
    return _alone(adapters)


def test_a_mixed_batch_gives_each_request_its_own_output(
    adapters: Adapters, alone: dict[str | None, list[int]]
) -> None:
    engine = make_engine(adapters.model)
    _load(engine, adapters)
    ids = {
        name: engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(i)), params=GREEDY, adapter=name, cache=False
            )
        )
        for i, name in enumerate((None, *NAMES))
    }
    batch_sizes: list[int] = []
    run_all(engine, lambda e: batch_sizes.append(len(e.scheduler.running)))
    assert max(batch_sizes) == 5  # all five really ran in one batch
    for name, rid in ids.items():
        assert outputs(engine, rid) == alone[name], name
    # Adapters change outputs (a tiny random model repeats tokens, so two may agree).
    assert len({tuple(alone[n]) for n in (None, *NAMES)}) >= 4


def test_the_cache_is_per_adapter_and_per_content(adapters: Adapters, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.utils.lora_adapters import make_peft_adapter

    engine = make_engine(adapters.model)
    _load(engine, adapters, ("r4", "r8"))
    prompt = list(range(100, 120))

    def cached(adapter: str | None) -> int:
        rid = engine.add_request(
            EngineRequest(prompt_token_ids=tuple(prompt), params=GREEDY, adapter=adapter)
        )
        run_all(engine)
        return engine.finished[rid].seqs[0].num_cached_tokens

    assert cached("r4") == 0
    assert cached("r8") == 0  # same prompt, another adapter: no shared KV
    assert cached(None) == 0  # the base model: none either
    assert cached("r4") > 0  # the same adapter again: a hit
    # "r4" reloaded with other weights: a new digest, so the old KV is not reused.
    other = make_peft_adapter(tmp_path / "new", adapters.model, 4, 8, seed=99)
    old = engine.adapter("r4").digest
    assert engine.load_adapter("r4", str(other)).digest != old
    assert cached("r4") == 0
    assert cached("r4") > 0


def test_load_and_unload_while_requests_run(adapters: Adapters) -> None:
    engine = make_engine(adapters.model)
    info = engine.load_adapter("r4", str(adapters.paths["r4"]))
    assert (info.rank, info.alpha, info.target_modules[0]) == (4, 8.0, "q_proj")
    long = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(1)), params=long, adapter="r4", cache=False)
    )
    engine.step()
    with pytest.raises(AdapterInUseError):
        engine.unload_adapter("r4")
    with pytest.raises(AdapterInUseError):
        engine.load_adapter("r4", str(adapters.paths["r8b"]))  # no swap under a live request
    engine.load_adapter("r8", str(adapters.paths["r8"]))  # loading another is fine mid-run
    rid8 = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(2)), params=GREEDY, adapter="r8", cache=False)
    )
    run_all(engine)
    assert outputs(engine, rid8) == _alone_tokens(adapters, "r8", 2)
    assert len(outputs(engine, rid)) == 12
    engine.unload_adapter("r4")
    assert [a.name for a in engine.adapters()] == ["r8"]
    with pytest.raises(InvalidRequestError) as err:
        engine.add_request(
            EngineRequest(prompt_token_ids=tuple(_prompt(1)), params=GREEDY, adapter="r4")
        )
    assert isinstance(err.value, AdapterNotFoundError) and err.value.code == "adapter_not_found"
    with pytest.raises(AdapterNotFoundError):
        engine.unload_adapter("r4")
    assert not engine.has_unfinished()


def _alone_tokens(adapters: Adapters, name: str, i: int) -> list[int]:
    engine = make_engine(adapters.model)
    engine.load_adapter(name, str(adapters.paths[name]))
    rid = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(i)), params=GREEDY, adapter=name, cache=False)
    )
    run_all(engine)
    return outputs(engine, rid)


def test_more_adapters_than_slots_all_finish_and_every_row_reads_its_own_slot(
    adapters: Adapters, alone: dict[str | None, list[int]]
) -> None:
    engine = make_engine(adapters.model, max_loras=2, max_cpu_loras=3)
    names = ("r4", "r8", "r16", "r8b", "r4b")
    _load(engine, adapters, names)
    order = [(None, 0), *((n, i + 1) for i, n in enumerate(names))]
    ids = {}
    for tenant in ("t:a", "t:b"):
        for name, i in order:
            ids[(tenant, name)] = engine.add_request(
                EngineRequest(
                    prompt_token_ids=tuple(_prompt(i)),
                    params=GREEDY,
                    adapter=name,
                    cache=False,
                    fairness_key=tenant,
                )
            )
    loads: list[tuple[int, str]] = []
    take = engine.lora.slots.take_loads

    def spy() -> list[tuple[int, str]]:
        got = take()
        loads.extend(got)
        return got

    engine.lora.slots.take_loads = spy  # type: ignore[method-assign]
    schedule = engine.scheduler.schedule

    def schedule_and_check() -> SchedulerOutput:
        output = schedule()
        resident = engine.lora.slots.resident
        for item in output.scheduled:
            if item.seq.adapter is not None:  # the slot it reads holds its adapter
                assert resident[item.seq.adapter] == item.seq.lora_slot
        return output

    engine.scheduler.schedule = schedule_and_check  # type: ignore[method-assign]
    waited: list[int] = []

    def check(e: LLMEngine) -> None:
        e.lora.slots.check_integrity()
        waited.append(sum(e.stats().lora_waiting.values()))

    run_all(engine, check)
    for (_, name), rid in ids.items():
        assert outputs(engine, rid) == alone[name], name
    assert max(waited) > 0  # some really waited for a slot
    assert len(loads) >= len(names)  # slots were reused
    assert engine.lora.registry.num_host_resident <= 3


def test_stats_count_requests_per_adapter(adapters: Adapters) -> None:
    engine = make_engine(adapters.model, max_loras=1)
    _load(engine, adapters, ("r4", "r8"))
    for name in ("r4", "r4", "r8", None):
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(0)), params=GREEDY, adapter=name, cache=False
            )
        )
    engine.step()
    stats = engine.stats()
    assert stats.max_loras == 1
    assert stats.lora_running == {"r4": 2}
    assert stats.lora_waiting == {"r8": 1}
    run_all(engine)
    assert engine.stats().lora_running == {} and engine.stats().lora_waiting == {}


def test_a_bad_adapter_folder_is_refused_clearly(adapters: Adapters, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from engine.errors import InvalidAdapterError
    from tests.utils.lora_adapters import make_peft_adapter

    engine = make_engine(adapters.model, max_lora_rank=8)
    big = make_peft_adapter(tmp_path / "big", adapters.model, 16, 16, seed=1)
    with pytest.raises(InvalidAdapterError, match="max_lora_rank"):
        engine.load_adapter("big", str(big))
    with pytest.raises(InvalidAdapterError):
        engine.load_adapter("none", str(tmp_path / "missing"))
    assert engine.adapters() == []


def test_a_tenant_waiting_for_a_slot_is_not_overtaken(adapters: Adapters) -> None:
    """One slot; tenant a floods adapter r4, tenant b asks for r8 once. Under the fair
    policy b's request comes next, and a's later requests, whose adapter holds the slot,
    do not jump ahead of it: it runs as soon as a's running ones end."""
    engine = make_engine(adapters.model, max_loras=1, scheduling_policy="fair", max_num_seqs=2)
    _load(engine, adapters, ("r4", "r8"))
    a_ids = [
        engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(i)),
                params=GREEDY,
                adapter="r4",
                cache=False,
                fairness_key="t:a",
            )
        )
        for i in range(6)
    ]
    engine.step()  # a's first two run and pin the only slot
    b_id = engine.add_request(
        EngineRequest(
            prompt_token_ids=tuple(_prompt(9)),
            params=GREEDY,
            adapter="r8",
            cache=False,
            fairness_key="t:b",
        )
    )
    order: list[str] = []

    def check(e: LLMEngine) -> None:
        for rid in e.finished:
            if rid not in order:
                order.append(rid)

    run_all(engine, check)
    assert order.index(b_id) < order.index(a_ids[-1])
    assert order.index(b_id) <= 3  # right after a's first running pair


def test_an_adapter_changed_on_disk_fails_its_requests_only(adapters: Adapters, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Host cache of one: r4's weights are read back from its folder when it needs a slot
    again; the folder changed meanwhile, so its request fails and the engine goes on."""
    import shutil

    folder = tmp_path / "r4"
    shutil.copytree(adapters.paths["r4"], folder)
    engine = make_engine(adapters.model, max_loras=1, max_cpu_loras=1)
    engine.load_adapter("r4", str(folder))
    engine.load_adapter("r8", str(adapters.paths["r8"]))  # evicts r4's weights from the host
    from tests.utils.lora_adapters import make_peft_adapter

    other = make_peft_adapter(tmp_path / "other", adapters.model, 4, 8, seed=42)
    shutil.copy(other / "adapter_model.safetensors", folder)  # same shapes, new weights
    bad = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(1)), params=GREEDY, adapter="r4", cache=False)
    )
    good = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(2)), params=GREEDY, adapter="r8", cache=False)
    )
    run_all(engine)
    failures = dict(engine.take_failures())
    assert set(failures) == {bad} and "changed on disk" in str(failures[bad])
    assert outputs(engine, good) == _alone_tokens(adapters, "r8", 2)
    engine.lora.slots.check_integrity()
    assert engine.lora.slots.resident == {"r8": 0}


def test_adapters_report_where_their_weights_are(adapters: Adapters) -> None:
    engine = make_engine(adapters.model, max_loras=1, max_cpu_loras=1)
    _load(engine, adapters, ("r4", "r8"))  # r8's weights push r4's out of host memory
    assert {a.name: a.location for a in engine.adapters()} == {"r4": "disk", "r8": "host"}
    engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(1)), params=GREEDY, adapter="r4", cache=False)
    )
    engine.step()
    # r4 is read again into host memory (evicting r8's weights) and copied to the slot.
    assert {a.name: a.location for a in engine.adapters()} == {"r4": "device", "r8": "disk"}
    stats = engine.stats()
    assert (stats.lora_device, stats.lora_host) == (("r4",), ("r4",))


def test_an_adapter_without_a_slot_starts_within_a_quantum_while_others_go_on(
    adapters: Adapters,
) -> None:
    """Two slots, both pinned by long requests (r4, r8). A request for r16 does not wait
    for them to end: after r4's quantum, r4's sequence pauses (keeping its KV) and r16
    takes the slot; meanwhile the base model's request runs at once. Every output is
    the one it has alone."""
    engine = make_engine(adapters.model, max_loras=2, max_num_seqs=16, lora_slot_quantum=2)
    _load(engine, adapters, ("r4", "r8", "r16"))
    long = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    short = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    first = {
        name: engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(i)), params=long, adapter=name, cache=False
            )
        )
        for i, name in enumerate(("r4", "r8"))
    }
    engine.step()
    r16 = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(2)), params=short, adapter="r16", cache=False)
    )
    base = engine.add_request(
        EngineRequest(prompt_token_ids=tuple(_prompt(3)), params=short, cache=False)
    )
    steps = [1]
    started: dict[str, int] = {}
    paused: set[str] = set()

    def check(e: LLMEngine) -> None:
        steps[0] += 1
        e.lora.slots.check_integrity()
        for seq in e.scheduler.running:
            started.setdefault(seq.request_id, steps[0])
            if seq.lora_slot is None:
                paused.add(seq.request_id)

    run_all(engine, check)
    assert started[base] == 2  # right away: nobody waits behind the adapter's queue
    assert started[r16] <= 4  # within the quantum, not after r4's 24 tokens
    assert paused & set(first.values())  # a long one gave way for a while
    reference = make_engine(adapters.model)
    _load(reference, adapters, ("r4", "r8", "r16"))
    for rid, (name, i, params) in {
        first["r4"]: ("r4", 0, long),
        first["r8"]: ("r8", 1, long),
        r16: ("r16", 2, short),
        base: (None, 3, short),
    }.items():
        alone = reference.add_request(
            EngineRequest(
                prompt_token_ids=tuple(_prompt(i)), params=params, adapter=name, cache=False
            )
        )
        run_all(reference)
        assert outputs(engine, rid) == outputs(reference, alone), name
