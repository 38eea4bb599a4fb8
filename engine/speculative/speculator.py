"""The engine's speculative decoding: who drafts, how many tokens, and what it earned.

Before each step `prepare` gives every running sequence that may speculate its
draft tokens (`Sequence.spec_token_ids`); the scheduler turns them into verify
rows where the step has room, and the runner accepts a prefix of each (see
verify.py). After the step `observe_step` feeds the outcome back: per sequence
to the adaptive draft length, per step to the batch gate, and to the counters.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.config import SpeculativeConfig
from engine.scheduler.output import SchedulerOutput
from engine.sequence import Sequence
from engine.speculative.adaptive import AdaptiveK
from engine.speculative.batch_gate import BatchGate
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import Proposer
from engine.speculative.stats import SpecDecodeStats


def may_speculate(seq: Sequence) -> bool:
    """Whether this sequence's sampling allows drafts at all.

    Structured output, logprobs, penalties, logit bias and a pending min_tokens
    depend on each token's history in ways the verifier does not replay; those
    requests decode one token per step, exactly as without speculation.
    """
    p = seq.params
    return (
        p.structured is None
        and p.logprobs is None
        and not p.logit_bias
        and p.presence_penalty == 0.0
        and p.frequency_penalty == 0.0
        and p.repetition_penalty == 1.0
        and seq.num_output_tokens >= p.min_tokens
    )


class Speculator:
    """Proposes drafts for the running sequences and keeps the acceptance record."""

    def __init__(
        self, config: SpeculativeConfig, max_model_len: int, proposer: Proposer | None = None
    ) -> None:
        self.config = config
        self.max_model_len = max_model_len
        # The engine builds the draft-model proposer (it owns the device and the dtype).
        self.proposer: Proposer = proposer if proposer is not None else NgramProposer()
        self.adaptive = AdaptiveK(config.num_speculative_tokens)
        self.gate = BatchGate(config.speculative_max_batch)
        self._step = 0
        # Whether the gate let this step draft: the step is measured as the gate's arm,
        # drafts or not (a drafting step whose sequences found no draft still counts as
        # drafting; attributing it to the plain arm would credit drafting only with the
        # steps where text repeats).
        self._allowed = False
        self._drafts = 0
        self._draft_tokens = 0
        self._accepted = 0
        self._per_pos = [0] * config.num_speculative_tokens

    def prepare(self, running: Iterable[Sequence]) -> None:
        """Sets `spec_token_ids` on every running sequence: drafts, or none."""
        self._step += 1
        decoding: list[Sequence] = []
        for seq in running:
            seq.spec_token_ids = []
            if seq.num_tokens - seq.num_computed_tokens == 1:
                decoding.append(seq)
        self._allowed = bool(decoding) and self.gate.allows(len(decoding))
        if not self._allowed:
            return
        asks: list[tuple[Sequence, int]] = []
        for seq in decoding:
            k = self._k(seq)
            if k > 0:
                asks.append((seq, k))
        if not asks:
            return
        drafts = self.proposer.propose(asks)
        for seq, k in asks:
            seq.spec_token_ids = list(drafts.get(seq.seq_id, ()))[:k]

    def _k(self, seq: Sequence) -> int:
        """Drafts worth proposing: the adaptive length, within what the sequence may still
        emit (a verify row emits one token past its drafts) and the context length."""
        if not may_speculate(seq):
            return 0
        left = min(seq.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
        return max(0, min(self.adaptive.k_for(seq.seq_id, self._step), left - 1))

    def observe_verify(self, seq_id: str, proposed: int, accepted: int) -> None:
        """One verify row's outcome: `accepted` of its `proposed` drafts taken."""
        if proposed <= 0:
            return
        self._drafts += 1
        self._draft_tokens += proposed
        self._accepted += accepted
        for pos in range(accepted):
            self._per_pos[pos] += 1
        self.adaptive.observe(seq_id, proposed, accepted, self._step)

    def observe_step(self, output: SchedulerOutput, emitted: int, elapsed_s: float) -> None:
        """A finished step: decode-only steps teach the batch gate what drafts earn."""
        if any(item.num_prompt_tokens for item in output.scheduled):
            return  # a prompt chunk's cost would drown the comparison
        self.gate.observe(len(output.scheduled), self._allowed, emitted, elapsed_s)

    def release(self, seq_id: str) -> None:
        """Forgets a finished sequence's record."""
        self.adaptive.release(seq_id)
        self.proposer.release(seq_id)

    def stats(self) -> SpecDecodeStats:
        """The counters so far."""
        return SpecDecodeStats(
            num_drafts=self._drafts,
            num_draft_tokens=self._draft_tokens,
            num_accepted_tokens=self._accepted,
            accepted_per_pos=tuple(self._per_pos),
        )
