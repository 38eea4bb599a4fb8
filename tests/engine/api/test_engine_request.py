"""EngineRequest: the one request object, checked once where it is built.

Bad fields are refused by its constructor with the engine's own error type (the
gateway maps it to a 400); nothing downstream (the fronts, the loop's inbox, a
child process unpickling it, LLMEngine) checks a field again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import pickle
from typing import Any

import pytest

import engine.request as request_module
from engine.errors import InvalidRequestError
from engine.request import MAX_NAME_LENGTH, MAX_PRIORITY, MIN_PRIORITY, EngineRequest
from engine.sampling_params import SamplingParams
from engine.scheduler.fair import FairQueue
from engine.sequence import Sequence
from tests.utils.engine_requests import make_sequence
from tests.utils.fast_fake_model import fast_fake_engine, fast_fake_llm_engine
from tests.utils.queue_order import admission_order

PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def _request(**fields: Any) -> EngineRequest:
    base: dict[str, Any] = {"prompt_token_ids": (1, 2, 3), "params": PARAMS}
    base.update(fields)
    return EngineRequest(**base)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"cache_domain": ""}, "cache_domain"),
        ({"cache_domain": "t:a\nX-Injected: 1"}, "cache_domain"),
        ({"cache_domain": "t:\x00a"}, "cache_domain"),
        ({"cache_domain": 5}, "cache_domain"),
        ({"cache_domain": None}, "cache_domain"),
        ({"cache_domain": "d" * (MAX_NAME_LENGTH + 1)}, "cache_domain"),
        ({"request_id": ""}, "request_id"),
        ({"request_id": "r\t1"}, "request_id"),
        ({"fairness_key": "t:\x1b[31m"}, "fairness_key"),
        ({"fairness_key": 7}, "fairness_key"),
        ({"adapter": ""}, "adapter"),
        ({"weight": 0.0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"weight": math.nan}, "weight"),
        ({"weight": math.inf}, "weight"),
        ({"weight": True}, "weight"),
        ({"weight": "2"}, "weight"),
        ({"priority": MAX_PRIORITY + 1}, "priority"),
        ({"priority": MIN_PRIORITY - 1}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"cache": "yes"}, "cache"),
        ({"params": {"max_tokens": 3}}, "params"),
        ({"prompt_token_ids": "hello"}, "prompt"),
        ({"prompt_token_ids": 5}, "prompt"),
        ({"prompt": b"bytes"}, "prompt"),
    ],
)
def test_bad_fields_are_refused_as_invalid_requests(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        _request(**fields)
    assert caught.value.param == param


def test_defaults_copy_and_freeze() -> None:
    ids = [4, 5, 6]
    request = EngineRequest(prompt_token_ids=ids, params=PARAMS, cache_domain="t:a/k:1")  # type: ignore[arg-type]
    ids.append(7)  # the caller's list changing later changes nothing
    assert request.prompt_token_ids == (4, 5, 6)
    assert request.fairness_key == "t:a/k:1"  # default: the cache domain
    assert request.priority == 0 and request.cache and request.weight is None
    assert len(request.request_id) == 32  # a fresh id when none is given
    assert _request().request_id != request.request_id
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.cache_domain = "t:b"  # type: ignore[misc]
    explicit = _request(fairness_key="t:a", weight=2, priority=MIN_PRIORITY, adapter="lora-1")
    assert (explicit.fairness_key, explicit.weight, explicit.priority) == ("t:a", 2, MIN_PRIORITY)


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The params whose name check ran, in order (`cache_domain` among them)."""
    seen: list[str] = []
    real = request_module._check_name

    def counting(value: object, param: str) -> None:
        seen.append(param)
        real(value, param)

    monkeypatch.setattr(request_module, "_check_name", counting)
    return seen


def test_a_pickled_request_is_not_checked_again(checks: list[str]) -> None:
    request = _request(cache_domain="t:a", fairness_key="t:a")
    assert checks.count("cache_domain") == 1
    copy = pickle.loads(pickle.dumps(request))  # what a ProcessEngine child receives
    assert copy == request
    assert checks.count("cache_domain") == 1


def test_the_cache_domain_is_checked_once_through_a_front(checks: list[str]) -> None:
    engine = fast_fake_engine(num_blocks=64, max_model_len=128)
    request = _request(cache_domain="t:a/u:1", fairness_key="t:a")

    async def main() -> int:
        await engine.start()
        try:
            stream = engine.submit(request)
            return len([t async for ev in stream for d in ev.deltas for t in d.token_ids])
        finally:
            await engine.shutdown()

    assert asyncio.run(main()) == 3
    assert checks.count("cache_domain") == 1  # built once; the front and engine trust it


def test_llm_engine_takes_the_request_and_does_not_recheck(checks: list[str]) -> None:
    engine = fast_fake_llm_engine(num_blocks=64, max_model_len=128)
    request = _request(cache_domain="t:a", priority=3)
    assert engine.add_request(request) == request.request_id
    assert checks.count("cache_domain") == 1
    (seq,) = engine.requests[request.request_id].seqs
    assert (seq.cache_domain, seq.fairness_key, seq.priority) == ("t:a", "t:a", 3)
    # Another request is checked once too, and a bad one queues nothing.
    engine.add_request(
        EngineRequest(prompt_token_ids=(1, 2), params=PARAMS, cache_domain="t:b", request_id="kw")
    )
    assert checks.count("cache_domain") == 2
    with pytest.raises(InvalidRequestError) as caught:
        engine.add_request(
            EngineRequest(prompt_token_ids=(1, 2), params=PARAMS, cache_domain="t:\nb")
        )
    assert caught.value.param == "cache_domain"
    assert set(engine.requests) == {request.request_id, "kw"}


def _seq(key: str, i: int, priority: int) -> Sequence:
    return make_sequence(
        seq_id=f"{key}{i}",
        request_id=f"{key}{i}",
        index=0,
        prompt_token_ids=[1] * 8,
        params=PARAMS,
        max_tokens=3,
        cache_domain=key,
        priority=priority,
    )


def _admission_order(priorities: dict[str, list[int]]) -> list[str]:
    queue = FairQueue()
    for i in range(4):
        for key, prios in priorities.items():
            queue.push(_seq(key, i, prios[i]))
    return [seq.seq_id for seq in admission_order(queue)]


def test_priority_orders_within_a_tenant_never_across() -> None:
    plain = _admission_order({"a": [0, 0, 0, 0], "b": [0, 0, 0, 0]})
    ranked = _admission_order({"a": [5, 0, 9, -1], "b": [0, 0, 0, 0]})
    # Which tenant goes next is the same turn by turn, priorities or not...
    assert [s[0] for s in ranked] == [s[0] for s in plain]
    # ...and within tenant a the lowest priority goes first (ties by arrival).
    assert [s for s in ranked if s[0] == "a"] == ["a3", "a1", "a0", "a2"]
    assert [s for s in ranked if s[0] == "b"] == [s for s in plain if s[0] == "b"]
