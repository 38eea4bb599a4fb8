"""End-to-end parity with Hugging Face transformers on the real SmolLM2 GGUF (fp32)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.utils.hf_smollm2 import hf_smollm2

pytestmark = pytest.mark.slow

PROMPTS = [
    "Hello",
    "The quick brown fox",
    "Write a short poem about the sea.",
    "What is the capital of Japan? Answer in one word.",
    "List three prime numbers greater than ten, separated by commas, and explain why each is prime.",
    "def add(a, b):\n    return",
    "In 1969, the first humans landed on the Moon. The mission was called",
    "Translate to French: 'The cat sleeps on the warm windowsill every afternoon while the "
    "rain falls outside and the city slowly wakes up.'",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def hf_model():  # noqa: ANN201
    return hf_smollm2()


def hf_greedy(model, ids: list[int]) -> list[int]:  # noqa: ANN001
    """Plain arg-max decoding with HF's own KV cache: no logits processors, EOS not special."""
    tokens: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        for _ in range(NEW_TOKENS):
            nxt = int(out.logits[0, -1].argmax())
            tokens.append(nxt)
            out = model(torch.tensor([[nxt]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens


def test_greedy_tokens_match_transformers_as_one_batch(hf_model) -> None:  # noqa: ANN001
    llm = LLM(max_model_len=1024, kv_cache_bytes=64 * 2**20)
    prompt_ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert len({len(p) for p in prompt_ids}) >= 6  # lengths really differ
    ours = llm.generate(
        prompt_ids, SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    )
    for ids, out in zip(prompt_ids, ours, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf_model, ids)
