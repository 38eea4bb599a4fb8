"""LoRA rows under speculative decoding: a verify row runs its drafts through its own
adapter, so greedy output is what each adapter gives without speculation."""

from __future__ import annotations

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.utils.lora_engine import Adapters, make_engine, outputs, run_all
from tests.utils.spec_proposers import SometimesWrong

LONG = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
NAMES = (None, "r4", "r8", "r16")


def _run(engine: LLMEngine, adapters: Adapters) -> dict[str | None, list[int]]:
    for name in NAMES[1:]:
        assert name is not None
        engine.load_adapter(name, str(adapters.paths[name]))
    ids = {
        name: engine.add_request(
            EngineRequest(
                prompt_token_ids=tuple([5 + i, 300, 301, 302, 5 + i, 300, 301] * 3),
                params=LONG,
                adapter=name,
            )
        )
        for i, name in enumerate(NAMES)
    }
    run_all(engine)
    return {name: outputs(engine, rid) for name, rid in ids.items()}


def test_adapters_give_the_same_tokens_with_speculation(adapters: Adapters) -> None:
    plain = _run(make_engine(adapters.model), adapters)
    engine = make_engine(adapters.model, speculative_method="ngram", speculative_max_batch=64)
    assert engine.speculator is not None
    engine.speculator.proposer = SometimesWrong()
    spec = _run(engine, adapters)
    assert spec == plain
    assert len({tuple(tokens) for tokens in plain.values()}) > 1  # the adapters matter
    stats = engine.stats().spec_decode
    assert stats is not None and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
