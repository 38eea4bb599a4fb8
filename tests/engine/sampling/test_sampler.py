"""The sampler end to end: greedy, truncated draws, distributions, seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from engine.sampling import Sampler, SamplingError, SamplingRow, make_generator
from engine.sampling.truncation import allowed_mask, top_k_tensor
from engine.sampling_params import SamplingParams


def _rows(params: SamplingParams, count: int, seed: int = 0) -> list[SamplingRow]:
    return [SamplingRow(params, make_generator(seed, i)) for i in range(count)]


def test_greedy_is_argmax_and_needs_no_generator() -> None:
    logits = torch.randn(16, 100, generator=torch.Generator().manual_seed(0))
    rows = [SamplingRow(SamplingParams(temperature=0.0), None) for _ in range(16)]
    out = Sampler().sample(logits, rows)
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 16


def test_greedy_follows_penalties() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    out = Sampler().sample(logits, [SamplingRow(params, None, prompt_token_ids=[0])])
    assert out.token_ids == [1]


def test_min_tokens_keeps_eos_out() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]] * 2)
    params = SamplingParams(temperature=0.0, min_tokens=1)
    rows = [
        SamplingRow(params, None, output_token_ids=[], suppress_eos=frozenset({0})),
        SamplingRow(params, None, output_token_ids=[2], suppress_eos=frozenset({0})),
    ]
    assert Sampler().sample(logits, rows).token_ids == [1, 0]


def test_sampled_row_without_generator_is_rejected() -> None:
    with pytest.raises(SamplingError):
        Sampler().sample(torch.zeros(1, 4), [SamplingRow(SamplingParams(), None)])


def test_row_count_must_match() -> None:
    with pytest.raises(SamplingError):
        Sampler().sample(torch.zeros(2, 4), _rows(SamplingParams(), 1))


def test_input_logits_are_not_modified() -> None:
    logits = torch.randn(3, 10)
    before = logits.clone()
    params = SamplingParams(logit_bias={1: 50.0}, repetition_penalty=1.5, top_p=0.5)
    Sampler().sample(logits, [SamplingRow(params, make_generator(1, 0), [1, 2], [3])] * 3)
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.9),
    ],
)
def test_draws_follow_the_truncated_softmax(params: SamplingParams) -> None:
    vocab = 12
    logits = torch.linspace(2.0, -2.0, vocab)[
        torch.randperm(vocab, generator=torch.Generator().manual_seed(3))
    ]
    draws = 8000
    out = Sampler().sample(logits.expand(draws, vocab).contiguous(), _rows(params, draws, seed=11))
    counts = torch.bincount(torch.tensor(out.token_ids), minlength=vocab)

    probs = torch.softmax(logits / params.temperature, dim=-1).unsqueeze(0)
    allowed = allowed_mask(
        probs,
        top_k_tensor([params.top_k], vocab, probs.device),
        torch.tensor([params.top_p]),
        torch.tensor([params.min_p]),
    )[0]
    assert counts[~allowed].sum().item() == 0
    kept = probs[0][allowed].double()
    expected = kept / kept.sum() * draws
    result = chisquare(counts[allowed].double().numpy(), expected.numpy())
    assert result.pvalue > 1e-3


def test_truncated_draws_stay_in_the_allowed_set_on_a_big_vocabulary() -> None:
    vocab = 4096
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(5)) * 4
    params = [SamplingParams(top_k=3), SamplingParams(top_p=0.5), SamplingParams(min_p=0.3)]
    rows = [SamplingRow(params[i % 3], make_generator(i, 0)) for i in range(64)]
    out = Sampler().sample(logits, rows)
    probs = torch.softmax(logits, dim=-1)
    allowed = allowed_mask(
        probs,
        top_k_tensor([r.params.top_k for r in rows], vocab, probs.device),
        torch.tensor([r.params.top_p for r in rows]),
        torch.tensor([r.params.min_p for r in rows]),
    )
    for i, token in enumerate(out.token_ids):
        assert allowed[i, token]


def test_prefix_and_full_sort_paths_agree() -> None:
    vocab = 2000
    logits = torch.randn(40, vocab, generator=torch.Generator().manual_seed(9)) * 2
    params = [
        SamplingParams(top_p=0.95),
        SamplingParams(top_k=50, top_p=0.9),
        SamplingParams(top_p=0.3),
        SamplingParams(top_k=5, top_p=0.99, min_p=0.01),
    ]

    def run(widths: tuple[int, ...]) -> list[int]:
        rows = [SamplingRow(params[i % 4], make_generator(i, 0)) for i in range(40)]
        return Sampler(candidate_widths=widths).sample(logits, rows).token_ids

    full_sort = run(())
    assert run((8,)) == full_sort
    assert run((8, 300)) == full_sort
    assert run((64, 600)) == full_sort


def _seeded_stream(others: int, steps: int = 12) -> list[int]:
    """Tokens of one seeded row at batch slot 0..others, with random neighbours."""
    vocab = 500
    data = torch.Generator().manual_seed(42)
    mine = torch.randn(steps, vocab, generator=data) * 2
    noise = torch.Generator().manual_seed(1000 + others)
    target = SamplingParams(temperature=0.8, top_p=0.9, seed=123)
    my_gen = make_generator(123, 0)
    neighbour_params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, top_k=7),
        SamplingParams(min_p=0.2, presence_penalty=1.0),
        SamplingParams(temperature=0.5, top_p=0.5),
    ]
    tokens: list[int] = []
    for step in range(steps):
        slot = step % (others + 1)
        logits = torch.randn(others + 1, vocab, generator=noise) * 3
        logits[slot] = mine[step]
        rows = [
            SamplingRow(neighbour_params[j % 4], make_generator(None, j), output_token_ids=[j])
            for j in range(others + 1)
        ]
        rows[slot] = SamplingRow(target, my_gen, output_token_ids=tokens.copy())
        tokens.append(Sampler(candidate_widths=(16, 64)).sample(logits, rows).token_ids[slot])
    return tokens


def test_seeded_row_ignores_its_batch() -> None:
    alone = _seeded_stream(0)
    assert _seeded_stream(3) == alone
    assert _seeded_stream(17) == alone
    assert len(set(alone)) > 1


def _stream(seed: int | None, index: int) -> list[int]:
    logits = torch.zeros(30, 1000)  # uniform: every draw counts
    rows = [SamplingRow(SamplingParams(), make_generator(seed, index))] * 30
    return Sampler().sample(logits, rows).token_ids


def test_sample_indices_and_missing_seeds_give_different_tokens() -> None:
    assert _stream(5, 0) == _stream(5, 0)
    assert _stream(5, 0) != _stream(5, 1)
    assert _stream(None, 0) != _stream(None, 0)


def test_logprobs_come_from_the_raw_logits() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(logprobs=5, temperature=0.3, repetition_penalty=1.7),
        SamplingParams(logprobs=0, temperature=0.0, logit_bias={7: 100.0}),
        SamplingParams(),
        SamplingParams(logprobs=20, top_k=3),
    ]
    rows = [SamplingRow(p, make_generator(i, 0), [1, 2, 3], [4]) for i, p in enumerate(params)]
    out = Sampler().sample(logits, rows)
    reference = torch.log_softmax(logits, dim=-1)
    assert out.token_ids[1] == 7
    assert out.logprobs[2] is None
    for i, wanted in ((0, 5), (1, 0), (3, 20)):
        entry = out.logprobs[i]
        assert entry is not None
        chosen, top = entry
        assert chosen == pytest.approx(reference[i, out.token_ids[i]].item(), abs=1e-6)
        assert len(top) == wanted
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        for token, value in top:
            assert value == pytest.approx(reference[i, token].item(), abs=1e-6)
        if wanted:
            assert top[0][0] == reference[i].argmax().item()
            assert math.isclose(top[0][1], reference[i].max().item(), abs_tol=1e-6)
