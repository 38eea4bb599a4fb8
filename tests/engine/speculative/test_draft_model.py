"""The draft-model proposer: its own paged KV, the target's tokenizer, exact output."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest
from safetensors.torch import save_file

from engine.llm_engine import LLMEngine
from engine.model.hf_loader import architecture_from_config
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.speculative.draft import DraftMismatchError, DraftProposer
from tests.utils.tiny_model import make_tiny_model_dir, random_state_dict

BLOCK = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    root = tmp_path_factory.mktemp("draft")
    return make_tiny_model_dir(root), make_tiny_model_dir(root, seed=3, num_layers=1, tie=False)


def _prompts() -> list[list[int]]:
    return [[100 + i, 200, 300 + 7 * i, 400, 500] * (2 + i) for i in range(4)]


def _run(target: pathlib.Path, **options: object) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine.from_options(
        str(target), block_size=BLOCK, num_blocks=96, speculative_max_batch=64, **options
    )
    engine.keep_finished = True
    ids = [
        engine.add_request(EngineRequest(prompt_token_ids=tuple(p), params=GREEDY))
        for p in _prompts()
    ]
    while engine.has_unfinished():
        engine.step()
        engine.kv.check_integrity()
    return [engine.finished[rid].seqs[0].output_token_ids for rid in ids], engine


def _alone_and_with_draft(
    target: pathlib.Path, draft: pathlib.Path
) -> tuple[list[list[int]], list[list[int]], LLMEngine]:
    """`target`'s greedy tokens alone, then with `draft` proposing, and that second engine."""
    plain, _ = _run(target)
    spec, engine = _run(target, speculative_method="draft", speculative_model=str(draft))
    return plain, spec, engine


def test_a_different_draft_model_gives_the_same_greedy_tokens(
    models: tuple[pathlib.Path, pathlib.Path],
) -> None:
    target, draft = models
    plain, spec, engine = _alone_and_with_draft(target, draft)
    assert spec == plain
    stats = engine.stats().spec_decode
    assert stats is not None and stats.num_drafts > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # another model: some misses
    # Every finished sequence gave its draft blocks back.
    assert engine.speculator is not None
    proposer = engine.speculator.proposer
    assert isinstance(proposer, DraftProposer)
    assert proposer.pool.num_uncached_free == proposer.pool.num_blocks


def test_the_target_as_its_own_draft_accepts_nearly_everything(
    models: tuple[pathlib.Path, pathlib.Path],
) -> None:
    target, _ = models
    plain, spec, engine = _alone_and_with_draft(target, target)
    assert spec == plain
    stats = engine.stats().spec_decode
    assert stats is not None and stats.acceptance_rate is not None
    assert stats.acceptance_rate > 0.95
    # With (almost) every draft taken, each verify row emits close to k + 1 tokens.
    assert stats.mean_accepted_length is not None and stats.mean_accepted_length > 3.5


def test_a_draft_with_another_vocabulary_is_refused_at_start(
    models: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    target, draft = models
    other = tmp_path / "other-vocab"
    shutil.copytree(draft, other)
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] += 64
    (other / "config.json").write_text(json.dumps(config))
    state = random_state_dict(architecture_from_config(config), 5)
    save_file(state, str(other / "model.safetensors"))
    with pytest.raises(DraftMismatchError, match="speculative_model"):
        LLMEngine.from_options(
            str(target), num_blocks=16, speculative_method="draft", speculative_model=str(other)
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative_method": "draft"}, "needs speculative_model"),
        ({"speculative_method": "ngram", "speculative_model": "/x"}, "speculative_model is set"),
    ],
)
def test_draft_settings_must_agree(
    models: tuple[pathlib.Path, pathlib.Path], options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LLMEngine.from_options(str(models[0]), num_blocks=16, **options)
