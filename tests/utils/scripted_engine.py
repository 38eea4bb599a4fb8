"""The real engine with a scripted answer: greedy requests get exactly a given text (or
token ids), then end-of-sequence.

Everything but the choice of token is the real engine: the AsyncEngine front's
validation, the scheduler, the KV cache and its prefix caching, adapters, stop strings,
the detokenizer. Only the logits a greedy row samples from are replaced, after the fake
fast model (tests/utils/fast_fake_model.py) computed them, by ones whose best token is
the script's next; sampled rows (temperature > 0) keep the fake model's logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.fronts.async_engine import AsyncEngine
from engine.llm_engine import LLMEngine
from tests.utils.fast_fake_model import GATEWAY_ENGINE_OPTIONS, fast_fake_llm_engine

# How far above every other token the script's token is put (a finite gap, so that
# logprobs stay finite numbers).
_GAP = 30.0


def script_tokens(engine: LLMEngine, reply: str | Sequence[int]) -> list[int]:
    """The token ids of `reply` in `engine`'s tokenizer (ids are taken as they are)."""
    if isinstance(reply, str):
        return engine.tokenizer.encode(reply, add_special_tokens=False)
    return list(reply)


def inject_script(engine: LLMEngine, reply: str | Sequence[int]) -> LLMEngine:
    """Makes every greedy sequence of `engine` produce `reply`'s tokens, then EOS.

    Patches the model runner's sampling step in place: each greedy row's logits are
    replaced by ones whose argmax is the script's token at that row's output position.
    """
    script = script_tokens(engine, reply)
    eos = min(engine.tokenizer.eos_token_ids)
    runner = engine.runner
    real_sample = runner._sample

    def _sample(seqs: list[Any], logits: torch.Tensor, pending: Any) -> Any:
        logits = logits.clone()
        for i, seq in enumerate(seqs):
            if not seq.params.greedy:
                continue
            step = seq.num_output_tokens
            token = script[step] if step < len(script) else eos
            logits[i].fill_(-_GAP)
            logits[i, token] = _GAP
        return real_sample(seqs, logits, pending)

    runner._sample = _sample  # type: ignore[method-assign]
    return engine


def scripted_llm_engine(reply: str | Sequence[int], **options: Any) -> LLMEngine:
    """An LLMEngine over the fake fast model, with `GATEWAY_ENGINE_OPTIONS` (`options`
    override them), whose greedy requests answer `reply`."""
    return inject_script(fast_fake_llm_engine(**{**GATEWAY_ENGINE_OPTIONS, **options}), reply)


def scripted_engine(reply: str | Sequence[int], **options: Any) -> AsyncEngine:
    """The real AsyncEngine over `scripted_llm_engine(reply, **options)`."""
    return AsyncEngine(scripted_llm_engine(reply, **options))


def one_token_per_char(engine: LLMEngine, text: str, *, but: str = "") -> list[int]:
    """`text` as one token per character (each character's own token in `engine`'s
    vocabulary), so that a scripted reply's token count is its length; with `but`, its
    first occurrence in `text` is one token instead (so that a reply and the
    end-of-sequence token that ends it are `len(text)` tokens)."""
    if but:
        head, tail = text.split(but, 1)
        (pair,) = engine.tokenizer.encode(but, add_special_tokens=False)
        return [*one_token_per_char(engine, head), pair, *one_token_per_char(engine, tail)]
    ids: list[int] = []
    for char in text:
        (token,) = engine.tokenizer.encode(char, add_special_tokens=False)
        ids.append(token)
    return ids
