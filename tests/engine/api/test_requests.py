"""Request-level behaviour of the offline API: sampling options, stops, n, logprobs, chat."""

from __future__ import annotations

import pathlib

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model: pathlib.Path) -> LLM:
    return LLM(str(tiny_model), num_blocks=256)


def test_outputs_carry_prompt_ids_text_and_finish_reason(llm: LLM) -> None:
    (out,) = llm.generate(
        "Hello there", SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    )
    assert out.prompt_token_ids == llm.tokenizer.encode("Hello there")
    assert out.num_cached_tokens == 0
    (choice,) = out.outputs
    assert len(choice.token_ids) == 5 and choice.finish_reason == "length"
    assert choice.text == llm.tokenizer.decode(choice.token_ids)


def test_token_id_prompts_are_accepted(llm: LLM) -> None:
    ids = llm.tokenizer.encode("Token ids in")
    by_ids = llm.generate([ids], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    by_text = llm.generate(
        ["Token ids in"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    assert by_ids[0].outputs[0].token_ids == by_text[0].outputs[0].token_ids


def test_seeded_sampling_is_independent_of_the_batch(llm: LLM) -> None:
    # The tiny random model is peaked; a high temperature makes the draws matter.
    seeded = SamplingParams(temperature=4.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate(["Seeded prompt"], seeded)[0].outputs[0].token_ids
    assert len(set(alone)) > 1  # the draws really vary, so the equality below means something
    others = SamplingParams(temperature=1.2, max_tokens=7, ignore_eos=True)
    mixed = llm.generate(
        ["noise one", "Seeded prompt", "noise two is longer than the others"],
        [others, seeded, others],
    )
    assert mixed[1].outputs[0].token_ids == alone
    unseeded = SamplingParams(temperature=4.0, max_tokens=12, ignore_eos=True)
    runs = {
        tuple(llm.generate(["Seeded prompt"], unseeded)[0].outputs[0].token_ids) for _ in range(3)
    }
    assert len(runs) > 1


def test_n_parallel_samples_differ_and_are_indexed(llm: LLM) -> None:
    (out,) = llm.generate(
        "Pick", SamplingParams(n=3, temperature=4.0, seed=7, max_tokens=8, ignore_eos=True)
    )
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_stop_token_ids_end_generation(llm: LLM) -> None:
    free = llm.generate("Stop me", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop_at = free.outputs[0].token_ids[3]
    first = free.outputs[0].token_ids.index(stop_at)
    out = llm.generate(
        "Stop me",
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_at]),
    )[0].outputs[0]
    assert out.token_ids == free.outputs[0].token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_stop_strings_are_cut_and_not_emitted(llm: LLM) -> None:
    free = llm.generate(
        "Stop string", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    )[0]
    text = free.outputs[0].text
    assert len(text) > 6
    stop = text[3:6]
    out = llm.generate(
        "Stop string", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    assert stop not in out.text


def test_logprobs_are_returned_per_token(llm: LLM) -> None:
    out = llm.generate(
        "Log", SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True)
    )[0]
    choice = out.outputs[0]
    assert choice.logprobs is not None and len(choice.logprobs) == 3
    for tok, pos in zip(choice.token_ids, choice.logprobs, strict=True):
        assert pos.chosen.token_id == tok
        assert len(pos.top) == 2
        # Greedy picks the most likely token: it is the first alternative.
        assert pos.top[0].token_id == tok
        assert pos.chosen.logprob == pytest.approx(pos.top[0].logprob)
        assert pos.chosen.logprob <= 0


def test_chat_applies_the_template(llm: LLM) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    via_chat = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    text = llm.tokenizer.apply_chat_template(msgs)
    assert "<|im_start|>user" in text
    assert via_chat.prompt_token_ids == llm.tokenizer.encode(text, add_special_tokens=False)
