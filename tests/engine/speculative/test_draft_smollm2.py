"""The bundled SmolLM2 as its own draft model: the upper bound of the draft proposer.

Same weights, same tokenizer: every draft the draft model proposes is the target's own
greedy token, so nearly all are accepted, and the output is the output without drafts.
"""

from __future__ import annotations

import pytest

from engine.llm_engine import LLMEngine
from engine.model.loader import default_model_path
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

KV_BYTES = 48 << 20


def _generate(**options: object) -> tuple[list[int], LLMEngine]:
    engine = LLMEngine.from_options(
        None, kv_cache_bytes=KV_BYTES, max_model_len=512, speculative_max_batch=8, **options
    )
    engine.keep_finished = True
    prompt = engine.tokenizer.encode(
        "The three primary colours are red, yellow and blue. The three"
    )
    engine.add_request(
        EngineRequest(
            prompt_token_ids=tuple(prompt),
            params=SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
            request_id="c",
        )
    )
    while engine.has_unfinished():
        engine.step()
    return engine.finished["c"].seqs[0].output_token_ids, engine


def test_smollm2_drafting_for_itself_accepts_nearly_every_draft() -> None:
    plain, _ = _generate()
    spec, engine = _generate(speculative_method="draft", speculative_model=default_model_path())
    assert spec == plain
    stats = engine.stats().spec_decode
    assert stats is not None and stats.num_drafts > 0
    assert stats.acceptance_rate is not None and stats.acceptance_rate > 0.9
