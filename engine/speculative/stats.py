"""Counters of speculative decoding, named after vLLM's `vllm:spec_decode_*` series."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecDecodeStats:
    """Monotonic counters over the engine's life (a snapshot)."""

    num_drafts: int = 0  # verify rows that carried at least one draft token
    num_draft_tokens: int = 0  # draft tokens proposed and scored
    num_accepted_tokens: int = 0  # of those, accepted
    # Accepted drafts by their position in the draft (index 0: the first draft token);
    # one entry per position up to num_speculative_tokens.
    accepted_per_pos: tuple[int, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed draft tokens; None before any was proposed."""
        if self.num_draft_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_draft_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens one verify row emits on average (accepted drafts plus the bonus token)."""
        if self.num_drafts == 0:
            return None
        return 1 + self.num_accepted_tokens / self.num_drafts
