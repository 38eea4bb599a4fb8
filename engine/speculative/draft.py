"""A draft model proposes: a small model with the target's tokenizer, run greedily for
k tokens on its own paged KV cache inside the same engine.

Each sequence has a shadow on the draft side: the tokens whose draft KV is cached,
and the draft blocks holding it. Before proposing, the shadow keeps the longest
prefix it shares with the sequence's known tokens (the accepted drafts are still
valid; a rejected one and everything after it is recomputed), catches up on the
rest in one chunk, then decodes k tokens, one batched forward pass per token for
all the sequences asking. The draft pool is its own: a sequence's draft KV never
takes blocks from the target pool, and no draft block is shared between sequences.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from engine.attention.backend import AttentionBackend
from engine.config import EngineConfig
from engine.kv_cache.block_pool import BlockPool
from engine.model.loader import LoadedModel, load_model
from engine.runner.model_runner import ModelRunner
from engine.sampling_params import SamplingParams
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence

_GREEDY = SamplingParams(temperature=0.0, max_tokens=None)

log = logging.getLogger("engine")


class DraftMismatchError(ValueError):
    """The draft model cannot propose for this target (another vocabulary)."""


def check_draft_fits(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuses a draft whose token ids mean other things than the target's."""
    if draft.arch.vocab_size != target.arch.vocab_size:
        raise DraftMismatchError(
            f"speculative_model {draft.name!r} has a vocabulary of {draft.arch.vocab_size} "
            f"tokens, the served model {target.arch.vocab_size}: they must share a tokenizer"
        )
    probe = "Speculative decoding: the draft and the target share one tokenizer. 123 ünï"
    if draft.tokenizer.encode(probe) != target.tokenizer.encode(probe):
        raise DraftMismatchError(
            f"speculative_model {draft.name!r} tokenizes text differently from the served "
            "model: they must share a tokenizer"
        )


class DraftProposer:
    """Greedy drafts from a small model with its own KV pool."""

    def __init__(
        self,
        draft: LoadedModel,
        backend: AttentionBackend,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.runner = ModelRunner(
            draft.model,
            draft.arch,
            backend,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype,
            device=device,
            eos_token_ids=frozenset(),
        )
        self._shadows: dict[str, Sequence] = {}

    def propose(self, seqs: list[tuple[Sequence, int]]) -> dict[str, list[int]]:
        """Up to k greedy draft tokens per sequence; [] where the draft pool is short."""
        asks: list[tuple[Sequence, int]] = []
        for seq, k in seqs:
            shadow = self._sync(seq, k)
            if shadow is not None:
                asks.append((shadow, k))
        for step in range(max((k for _, k in asks), default=0)):
            batch = [shadow for shadow, k in asks if k > step]
            items = tuple(
                ScheduledSequence(s, s.num_computed_tokens, s.num_tokens - s.num_computed_tokens)
                for s in batch
            )
            sampled = self.runner.execute(
                SchedulerOutput(items, sum(i.num_new_tokens for i in items))
            )
            for item in items:
                item.seq.num_computed_tokens = item.end
                item.seq.output_token_ids.append(sampled[item.seq.seq_id].token_id)
        return {shadow.seq_id: shadow.output_token_ids[:k] for shadow, k in asks}

    def _sync(self, seq: Sequence, k: int) -> Sequence | None:
        """The sequence's shadow, cut back to the prefix its draft KV still holds and with
        blocks for k drafts; None when the draft pool cannot hold them."""
        tokens = seq.all_token_ids
        shadow = self._shadows.get(seq.seq_id)
        if shadow is None:
            shadow = dataclasses.replace(
                seq,
                request=dataclasses.replace(seq.request, params=_GREEDY, adapter=None),
                prompt_token_ids=[],
                output_token_ids=[],
                block_ids=[],
                num_computed_tokens=0,
                spec_token_ids=[],
                adapter_digest=None,
                lora_slot=None,
            )
            self._shadows[seq.seq_id] = shadow
        cached = shadow.token_ids(0, shadow.num_computed_tokens)
        valid = 0
        for a, b in zip(cached, tokens, strict=False):
            if a != b:
                break
            valid += 1
        shadow.prompt_token_ids = tokens
        shadow.output_token_ids = []
        # At least the last known token is computed: its logits give the first draft.
        shadow.num_computed_tokens = min(valid, len(tokens) - 1)
        # The KV written: the known tokens, then all drafts but the last.
        need = -(-(len(tokens) + k - 1) // self.block_size) - len(shadow.block_ids)
        if need > 0:
            if need > self.pool.num_uncached_free:
                return None
            shadow.block_ids.extend(self.pool.allocate(need))
        return shadow

    def release(self, seq_id: str) -> None:
        """Frees a finished sequence's draft blocks."""
        shadow = self._shadows.pop(seq_id, None)
        if shadow is None:
            return
        if shadow.block_ids:
            self.pool.free(shadow.block_ids)
        self.runner.release(seq_id)


def build_draft_proposer(
    config: EngineConfig,
    target: LoadedModel,
    backend: AttentionBackend,
    *,
    num_blocks: int,
    device: torch.device,
) -> DraftProposer:
    """Loads `speculative_model` and checks it shares the served model's tokenizer.

    Its KV pool has as many blocks as the target's: a draft model is smaller, so its
    blocks are too, and every running sequence can keep its draft KV.
    """
    path = config.speculative.speculative_model
    assert path is not None  # SpeculativeConfig checked it
    draft = load_model(path, dtype=config.model.dtype, device=device, progress=False)
    check_draft_fits(target, draft)
    log.info("speculative decoding: draft model %s", draft.name)
    return DraftProposer(
        draft,
        backend,
        num_blocks=num_blocks,
        block_size=config.cache.block_size,
        dtype=config.model.dtype,
        device=device,
    )
