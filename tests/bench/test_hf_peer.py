"""bench/hf_peer.py maps the engine's random weights onto transformers' Llama exactly."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from bench import gpu_engine, hf_peer
from bench.model_shape import ModelShape
from engine.model.llama import LlamaForCausalLM
from tests.utils.model_step import ModelStepper

pytest.importorskip("transformers")


# A tiny GQA Llama shape.
TINY = ModelShape("tiny", 2, 64, 4, 2, 16, 128, 512)


def _ours_and_hf(seed: int) -> tuple[LlamaForCausalLM, Any]:
    arch = gpu_engine.arch_from_shape(TINY, 128)
    ours = gpu_engine.random_model(arch, dtype=torch.float32, device=torch.device("cpu"), seed=seed)
    return ours, hf_peer.hf_from_ours(ours)


def test_hf_logits_equal_ours_on_the_same_random_weights() -> None:
    ours, hf = _ours_and_hf(seed=5)
    ids = gpu_engine.random_prompts(1, 21, 512, seed=9)[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    stepper = ModelStepper(ours, block_size=16)
    got = torch.cat(
        [stepper.step([ids[:17]]), stepper.step([ids[17:18]]), stepper.step([ids[18:]])]
    )
    assert ref.shape == got.shape == (21, 512)
    assert ref.std() > 0.5  # logits that really depend on the weights
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_hf_shares_the_engine_tensors_and_the_tied_head() -> None:
    ours, hf = _ours_and_hf(seed=1)
    hf_params = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        assert hf_params[name].data_ptr() == param.data_ptr(), name
    assert hf.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()


def test_greedy_helpers_agree_with_the_engine_and_flag_a_flip() -> None:
    ours, hf = _ours_and_hf(seed=2)
    prompts = [gpu_engine.random_prompts(1, n, 512, seed=n)[0] for n in (5, 19)]
    ref = hf_peer.hf_greedy(hf, prompts, 6)
    got = hf_peer._ours_greedy(ours, torch.device("cpu"), prompts, 6, "torch")
    summary = gpu_engine.compare_greedy(ref, got, [5, 19])
    assert summary["identical"] == 2 and summary["passed"]
    # A changed token is reported at its step, and the top-5 margins decide "rounding".
    tokens, tops = got[1]
    other = next(t for t in tops[3] if t != tokens[3])
    flipped = [(tokens[:3] + [other] + tokens[4:], tops)]
    row = gpu_engine.compare_greedy(ref[1:], flipped, [19])["prompts"][0]
    assert row["first_diff"] == 3
    assert row["explained_by_rounding"] == (tops[3][tokens[3]] - tops[3][other] < 0.25)


def test_config_rejects_shapes_the_peer_does_not_cover() -> None:
    arch = dataclasses.replace(gpu_engine.arch_from_shape(TINY, 64), attention_bias=True)
    with pytest.raises(ValueError, match="plain Llama"):
        hf_peer.hf_config(arch)
