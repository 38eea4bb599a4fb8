"""The matchers of the live structured sequences, kept in step with their output tokens.

Invariant: before a sequence's mask is filled, its matcher has consumed exactly
the sequence's output tokens (`consumed == num_output_tokens`). A step consumes
the token it samples at once (to know whether the grammar is complete); if the
step is then retried (engine.fronts.step_isolation) or its token is never appended, the
next sync rolls the matcher back. So the matcher's state is a function of the
sequence's own history, like its penalty counts and its random draws.

A sequence whose constraint can go no further (a dead end: no token continues it; a
parser limit; more mask time than `grammar_mask_budget_s`) is not an error of the
step: its row is reported as ended, with the reason, and the engine ends that request
alone, keeping what it delivered. Raising would fail the request as a 500 and make
the whole batch run again to find the culprit (engine.fronts.step_isolation).

Masks are off the step's critical path where llguidance allows (it drops the GIL
while it fills): a step's masks are filled on a worker thread while its forward runs,
and once a sequence's token is consumed the mask of its next token is filled ahead,
on threads of their own. Until that mask is done the sequence is not `ready` and the
scheduler leaves it out of the step, so a grammar slow to mask (an ambiguous Lark
grammar can take a second a token) slows its own request, not the batch. A filled
ahead mask is used only if the sequence is still where it was (a retried or rolled
back step fills again).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
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
# Threads that fill the masks of sequences' next tokens ahead of their steps.
AHEAD_THREADS = 2


class StructuredDecodingError(EngineError):
    """A structured sequence's matcher refused a token or could not continue."""


@dataclass
class _State:
    matcher: llguidance.LLMatcher
    consumed: int = 0
    mask_s: float = 0.0  # host time its masks took, in all
    ended: str | None = None  # why its constraint can go no further (None: it can)
    # The mask of its next token, filled on the worker thread once the last one was
    # consumed, and the consumed count it is for (-1: none).
    ahead: concurrent.futures.Future[torch.Tensor] | None = None
    ahead_at: int = -1


@dataclass(frozen=True)
class PendingMasks:
    """Masks being filled on the table's worker thread while a step's forward runs."""

    seqs: tuple[Sequence, ...]
    rows: tuple[int, ...]
    states: list[_State]
    bitmask: torch.Tensor
    future: concurrent.futures.Future[None]


class MatcherTable:
    """One matcher per live structured sequence, built from the compiler's cache."""

    def __init__(self, compiler: GrammarCompiler | None, *, pin_memory: bool = False) -> None:
        self.compiler = compiler
        self._states: dict[str, _State] = {}
        self._pin = pin_memory
        self._buffer: torch.Tensor | None = None
        self._executor: llguidance.LLExecutor | None = None
        self._worker: concurrent.futures.ThreadPoolExecutor | None = None
        self._ahead: concurrent.futures.ThreadPoolExecutor | None = None
        self.fill_s = 0.0  # host time of every mask fill so far, on any thread
        self._fill_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def start_masks(self, seqs: Seq[Sequence]) -> PendingMasks | None:
        """Starts filling the masks of the structured rows of this batch on the table's
        worker thread (llguidance drops the GIL while it fills), so that they are made
        while the step's forward runs; None when there are none. A row whose mask was
        filled ahead (`ready`) takes it. `finish_masks` must follow before the matchers
        are used again."""
        rows = [i for i, seq in enumerate(seqs) if seq.params.structured is not None]
        if not rows:
            return None
        states = [self._synced(seqs[i]) for i in rows]
        bitmask = self._bitmask(len(rows))
        to_fill: list[tuple[_State, int]] = []
        for k, state in enumerate(states):
            if not self._take_ahead(state, bitmask, k):
                to_fill.append((state, k))
        future = self._filler().submit(self._fill, to_fill, bitmask)
        return PendingMasks(tuple(seqs), tuple(rows), states, bitmask, future)

    def ready(self, seq: Sequence) -> bool:
        """False while the mask of the sequence's next token is still being filled: the
        scheduler leaves it out of the step, so that a slow grammar holds no other row."""
        state = self._states.get(seq.seq_id)
        return state is None or state.ahead is None or state.ahead.done()

    def wait_ahead(self, timeout_s: float) -> None:
        """Waits (at most `timeout_s`) until one mask being filled ahead is done; returns
        at once when none is."""
        pending = [st.ahead for st in self._states.values() if st.ahead and not st.ahead.done()]
        if pending:
            concurrent.futures.wait(
                pending, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def _take_ahead(self, state: _State, bitmask: torch.Tensor, k: int) -> bool:
        """Copies the state's mask filled ahead into row `k`, if it is for its present
        position; the ahead mask is used up either way."""
        ahead, at = state.ahead, state.ahead_at
        state.ahead, state.ahead_at = None, -1
        if ahead is None or at != state.consumed or state.ended is not None:
            return False
        try:
            row = ahead.result()
        except Exception:  # filled again with the others, where an error is the step's
            return False
        bitmask[k].copy_(row[0])
        return True

    def _fill_ahead(self, state: _State) -> torch.Tensor:
        """The mask of the state's next token, on the worker thread."""
        assert self.compiler is not None
        row = torch.empty((1, mask_words(self.compiler.vocab_size)), dtype=torch.int32)
        self._fill([(state, 0)], row)
        return row

    def _settle(self, state: _State) -> None:
        """Waits for the state's mask being filled ahead: its matcher is the worker's
        until then."""
        if state.ahead is not None:
            concurrent.futures.wait([state.ahead])

    def finish_masks(self, pending: PendingMasks) -> TokenMask:
        """Waits for the masks `start_masks` began; ends the rows whose constraint can go
        no further."""
        pending.future.result()
        bitmask, seqs = pending.bitmask, pending.seqs
        empty = (~bitmask.any(dim=1)).tolist()
        for k, (row, state) in enumerate(zip(pending.rows, pending.states, strict=True)):
            if state.ended is None:
                state.ended = self._why_ended(seqs[row], state, empty[k])
            if state.ended is not None:
                bitmask[k].fill_(-1)  # any token: its sample is dropped, the row ends
        return TokenMask(pending.rows, bitmask)

    def _fill(self, items: list[tuple[_State, int]], bitmask: torch.Tensor) -> None:
        """Fills each state's mask into its row of `bitmask` (on the worker thread),
        timing each."""
        spent = [state.mask_s for state, _ in items]
        if len(items) >= _PARALLEL_FROM and (os.cpu_count() or 1) >= _PARALLEL_MIN_CPUS:
            start = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask_par(
                self._parallel(), [(st.matcher, k) for st, k in items], bitmask
            )
            share = (time.perf_counter() - start) / len(items)  # per row: not measurable
            for state, _ in items:
                state.mask_s += share
        else:
            for state, k in items:
                start = time.perf_counter()
                llguidance.torch.fill_next_token_bitmask(state.matcher, bitmask, k)
                state.mask_s += time.perf_counter() - start
        took = sum(st.mask_s - was for (st, _), was in zip(items, spent, strict=True))
        with self._fill_lock:
            self.fill_s += took

    def _ahead_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that fill masks ahead: apart from the step's own worker, so that a
        slow grammar's next mask never queues a step's fill behind it."""
        if self._ahead is None:
            self._ahead = concurrent.futures.ThreadPoolExecutor(
                AHEAD_THREADS, thread_name_prefix="mask-ahead"
            )
        return self._ahead

    def _filler(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mask-fill")
        return self._worker

    def consume(
        self, seqs: Seq[Sequence], tokens: Seq[int], mask: TokenMask
    ) -> tuple[set[str], dict[str, str]]:
        """Feeds each masked row its sampled token; returns the sequences now complete,
        and those whose constraint can go no further, each with why (their token is
        not consumed: it is dropped)."""
        done: set[str] = set()
        ended: dict[str, str] = {}
        for row in mask.rows:
            seq = seqs[row]
            state = self._states[seq.seq_id]
            if state.ended is None and not state.matcher.consume_token(int(tokens[row])):
                state.ended = _limit_reached(state.matcher.get_error())
            if state.ended is not None:
                ended[seq.seq_id] = state.ended
                continue
            state.consumed += 1
            if state.matcher.is_stopped():
                done.add(seq.seq_id)
            elif seq.num_output_tokens + 1 < seq.max_tokens:  # it needs a next token
                state.ahead = self._ahead_pool().submit(self._fill_ahead, state)
                state.ahead_at = state.consumed
        return done, ended

    def rewind(self, seq: Sequence) -> None:
        """Rolls the matcher back to the sequence's output tokens (a retried step)."""
        state = self._states.get(seq.seq_id)
        if state is not None and state.ended is None:
            self._settle(state)
            self._sync(seq, state)

    def release(self, seq_id: str) -> None:
        """Forgets a finished sequence's matcher, and drops the mask of its next token if
        that is still queued: an aborted request's fill (up to a second a mask for an
        ambiguous grammar) would otherwise run for nobody, ahead of live sequences'."""
        state = self._states.pop(seq_id, None)
        if state is not None and state.ahead is not None:
            state.ahead.cancel()  # a fill already running cannot be stopped: it ends alone
            state.ahead, state.ahead_at = None, -1

    def consumed(self, seq_id: str) -> int | None:
        """How many tokens the sequence's matcher has consumed (None: no matcher)."""
        state = self._states.get(seq_id)
        return None if state is None else state.consumed

    def _why_ended(self, seq: Sequence, state: _State, empty: bool) -> str | None:
        """Why this mask ends the sequence's constraint, or None when it goes on."""
        if state.matcher.is_error():
            return _limit_reached(state.matcher.get_error())
        if empty:
            return "its output constraint reached a dead end: no token can continue it"
        assert self.compiler is not None
        budget = self.compiler.config.grammar_mask_budget_s
        if state.mask_s > budget:
            why = (
                f"its output constraint took more than the {budget:g} s of mask time "
                "a request may use; simplify the grammar"
            )
            spec = seq.params.structured
            assert spec is not None
            # The same spec from the same domain is refused when compiled, from now on.
            self.compiler.refuse(spec, seq.cache_domain, why.replace("its", "this", 1))
            return why
        return None

    def _synced(self, seq: Sequence) -> _State:
        state = self._states.get(seq.seq_id)
        if state is None:
            if self.compiler is None:
                raise StructuredDecodingError("this engine has no grammar compiler")
            spec = seq.params.structured
            assert spec is not None
            state = _State(self.compiler.matcher(spec, seq.cache_domain))
            self._states[seq.seq_id] = state
        self._settle(state)
        if state.ended is None:
            self._sync(seq, state)
        return state

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


def _limit_reached(error: str) -> str:
    """The reason of an ended constraint from llguidance's error (one line, no grammar:
    the compiler's limits ask for terse errors)."""
    first = error.strip().splitlines()[0] if error.strip() else ""
    if not first or "NoExtensionBias" in first:
        return "its output constraint reached a dead end: no token can continue it"
    return f"its output constraint reached a parser limit: {first}"
