"""The matchers of the live structured sequences, kept in step with their output tokens.

Invariant: before a sequence's mask is filled, its matcher has consumed exactly
the sequence's output tokens (`consumed == num_output_tokens`). A step consumes
the token it samples at once (to know whether the grammar is complete); if the
step is then retried (engine.step_isolation) or its token is never appended, the
next sync rolls the matcher back. So the matcher's state is a function of the
sequence's own history, like its penalty counts and its random draws.
"""

from __future__ import annotations

import os
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import llguidance
import llguidance.torch
import torch

from engine.errors import EngineError
from engine.sequence import Sequence
from engine.structured.compiler import GrammarCompiler
from engine.structured.token_mask import TokenMask, mask_words

# Parallel mask fills pay for their thread hand-over only from this many rows on, and
# only with cores to spare (measured: on 2 busy cores, 8 rows took 2.2 ms in parallel
# and 0.6 ms one after the other).
_PARALLEL_FROM = 16
_PARALLEL_MIN_CPUS = 4


class StructuredDecodingError(EngineError):
    """A structured sequence's matcher refused a token or could not continue."""


@dataclass
class _State:
    matcher: llguidance.LLMatcher
    consumed: int = 0


class MatcherTable:
    """One matcher per live structured sequence, built from the compiler's cache."""

    def __init__(self, compiler: GrammarCompiler | None, *, pin_memory: bool = False) -> None:
        self.compiler = compiler
        self._states: dict[str, _State] = {}
        self._pin = pin_memory
        self._buffer: torch.Tensor | None = None
        self._executor: llguidance.LLExecutor | None = None

    def __len__(self) -> int:
        return len(self._states)

    def masks(self, seqs: Seq[Sequence]) -> TokenMask | None:
        """The allowed tokens of the structured rows of this batch; None when there are none."""
        rows = [i for i, seq in enumerate(seqs) if seq.params.structured is not None]
        if not rows:
            return None
        matchers = [self._synced(seqs[i]) for i in rows]
        bitmask = self._bitmask(len(rows))
        if len(rows) >= _PARALLEL_FROM and (os.cpu_count() or 1) >= _PARALLEL_MIN_CPUS:
            llguidance.torch.fill_next_token_bitmask_par(
                self._parallel(), [(m, k) for k, m in enumerate(matchers)], bitmask
            )
        else:
            for k, matcher in enumerate(matchers):
                llguidance.torch.fill_next_token_bitmask(matcher, bitmask, k)
        for seq, matcher in zip((seqs[i] for i in rows), matchers, strict=True):
            if matcher.is_error():
                raise StructuredDecodingError(f"{seq.seq_id}: {matcher.get_error()}")
        return TokenMask(tuple(rows), bitmask)

    def consume(self, seqs: Seq[Sequence], tokens: Seq[int], mask: TokenMask) -> set[str]:
        """Feeds each masked row its sampled token; returns the sequences now complete."""
        done: set[str] = set()
        for row in mask.rows:
            seq = seqs[row]
            state = self._states[seq.seq_id]
            if not state.matcher.consume_token(int(tokens[row])):
                raise StructuredDecodingError(
                    f"{seq.seq_id}: token {tokens[row]} refused: {state.matcher.get_error()}"
                )
            state.consumed += 1
            if state.matcher.is_stopped():
                done.add(seq.seq_id)
        return done

    def rewind(self, seq: Sequence) -> None:
        """Rolls the matcher back to the sequence's output tokens (a retried step)."""
        state = self._states.get(seq.seq_id)
        if state is not None:
            self._sync(seq, state)

    def release(self, seq_id: str) -> None:
        """Forgets a finished sequence's matcher."""
        self._states.pop(seq_id, None)

    def consumed(self, seq_id: str) -> int | None:
        """How many tokens the sequence's matcher has consumed (None: no matcher)."""
        state = self._states.get(seq_id)
        return None if state is None else state.consumed

    def _synced(self, seq: Sequence) -> llguidance.LLMatcher:
        state = self._states.get(seq.seq_id)
        if state is None:
            if self.compiler is None:
                raise StructuredDecodingError("this engine has no grammar compiler")
            spec = seq.params.structured
            assert spec is not None
            state = _State(self.compiler.matcher(spec, seq.cache_domain))
            self._states[seq.seq_id] = state
        self._sync(seq, state)
        return state.matcher

    def _sync(self, seq: Sequence, state: _State) -> None:
        target = seq.num_output_tokens
        if state.consumed > target:
            if not state.matcher.rollback(state.consumed - target):
                raise StructuredDecodingError(f"{seq.seq_id}: rollback failed")
            state.consumed = target
        elif state.consumed < target:
            # Tokens this table never saw (a sequence restored from elsewhere).
            for token in seq.output_token_ids[state.consumed : target]:
                if not state.matcher.consume_token(token):
                    raise StructuredDecodingError(
                        f"{seq.seq_id}: token {token} refused: {state.matcher.get_error()}"
                    )
            state.consumed = target

    def _bitmask(self, rows: int) -> torch.Tensor:
        """Host rows for the masks, reused across steps (pinned on CUDA)."""
        assert self.compiler is not None
        words = mask_words(self.compiler.vocab_size)
        buffer = self._buffer
        if buffer is None or buffer.shape[0] < rows:
            size = max(rows, 2 * (0 if buffer is None else buffer.shape[0]), 8)
            buffer = torch.empty((size, words), dtype=torch.int32, pin_memory=self._pin)
            self._buffer = buffer
        return buffer[:rows]

    def _parallel(self) -> llguidance.LLExecutor:
        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=min(4, os.cpu_count() or 1))
        return self._executor
