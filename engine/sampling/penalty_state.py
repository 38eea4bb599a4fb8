"""Per-sequence penalty state kept across steps, so a step costs O(new tokens), not O(context).

The penalties need, per row, how often each token occurs in the output and
(for the repetition penalty) which tokens the prompt holds. Rebuilding that
from the whole history every step costs O(batch x context) on the host and one
small copy per row. Instead each sequence that uses a penalty keeps a slot in
two tables on the sampler's device:

    counts        [slots, V] float32 output-token counts (exact below 2**24)
    prompt_seen   [slots, V] bool    tokens of the prompt (repetition penalty only)

and a step folds in only the output tokens appended since the slot was last
synced, with one batched scatter for the whole batch:

    slot 3 synced 200, output now 201 tokens -> counts[3, output[200]] += 1

Contract with the caller: a row's `output_token_ids` only grows in place
(`Sequence.output_token_ids` is appended to by the scheduler; a preemption
keeps it), and its `prompt_token_ids` never changes. A slot keeps a reference
to the very objects it mirrors; a row that brings other objects, or fewer
outputs than were synced, has its slot rebuilt from its whole history: an
O(context) cost once, not per step. Rows without a `state_key` get a slot for
the one call only.

The tables are only ever created and written inside inference mode: the runner
samples inside it and releases outside it, and torch forbids writing an
inference tensor outside inference mode. So `release` touches no tensor; a
slot is zeroed when it is next taken.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling.row import SamplingError, SamplingRow


@dataclass
class _Slot:
    index: int
    prompt: Sequence[int]  # the very objects last synced
    output: Sequence[int]
    synced: int  # leading output tokens already counted
    has_prompt: bool  # prompt_seen row filled


@dataclass(frozen=True)
class PenaltyRows:
    """Table rows of one call's penalty rows, in the order they were asked for.

    `counts` and `prompt_seen` are the whole tables; index them with `slots`.
    `prompt_seen` is None when no row of the call needs it.
    """

    slots: torch.Tensor  # [P] long, on the tables' device
    counts: torch.Tensor
    prompt_seen: torch.Tensor | None


class PenaltyState:
    """Slots of output-token counts and prompt masks for the sequences that use penalties.

    Tables start small and double on demand, on the device and vocabulary of the
    first logits seen (a call with another one starts over from the histories).
    """

    def __init__(self, initial_slots: int = 8) -> None:
        """`initial_slots`: rows allocated at first use, before any doubling."""
        self._initial = max(1, initial_slots)
        self._counts: torch.Tensor | None = None
        self._prompt_seen: torch.Tensor | None = None
        self._slots: dict[str, _Slot] = {}
        self._free: list[int] = []

    @property
    def num_live_slots(self) -> int:
        """Slots held by keyed sequences (for tests and leak checks)."""
        return len(self._slots)

    def release(self, key: str) -> None:
        """Frees the slot of a sequence that will not sample again (zeroed on reuse)."""
        slot = self._slots.pop(key, None)
        if slot is not None:
            self._free.append(slot.index)

    def sync(
        self,
        rows: Sequence[SamplingRow],
        needs_prompt: Sequence[bool],
        vocab_size: int,
        device: torch.device,
    ) -> PenaltyRows:
        """Brings the slots of `rows` up to date and returns their table rows.

        Costs O(output tokens appended since the last call) per keyed row, plus
        O(history) for a row seen for the first time, rebuilt, or without a key.
        """
        with torch.inference_mode():
            self._ensure_tables(vocab_size, device, any(needs_prompt))
            temporary: list[int] = []
            by_key: dict[str, _Slot] = {}
            try:
                return self._sync(rows, needs_prompt, device, by_key, temporary)
            except Exception:
                # Slots may have advanced past what was written: forget them (rebuilt later).
                for key in by_key:
                    self.release(key)
                raise
            finally:
                self._free.extend(temporary)

    def _sync(
        self,
        rows: Sequence[SamplingRow],
        needs_prompt: Sequence[bool],
        device: torch.device,
        by_key: dict[str, _Slot],
        temporary: list[int],
    ) -> PenaltyRows:
        indices: list[int] = []
        reset: list[int] = []
        count_rows: list[int] = []
        count_tokens: list[int] = []
        prompt_rows: list[int] = []
        prompt_tokens: list[int] = []
        for row, want_prompt in zip(rows, needs_prompt, strict=True):
            slot = self._slot_for(row, by_key, temporary, reset)
            if want_prompt and not slot.has_prompt:
                prompt_rows.extend([slot.index] * len(row.prompt_token_ids))
                prompt_tokens.extend(row.prompt_token_ids)
                slot.has_prompt = True
            output = row.output_token_ids
            if len(output) > slot.synced:
                new = output[slot.synced :]
                count_rows.extend([slot.index] * len(new))
                count_tokens.extend(new)
                slot.synced = len(output)
            indices.append(slot.index)
        return self._write(
            indices, reset, count_rows, count_tokens, prompt_rows, prompt_tokens, device
        )

    def _slot_for(
        self,
        row: SamplingRow,
        by_key: dict[str, _Slot],
        temporary: list[int],
        reset: list[int],
    ) -> _Slot:
        key = row.state_key
        if key is None:
            index = self._take_index()
            temporary.append(index)
            reset.append(index)
            return _Slot(index, row.prompt_token_ids, row.output_token_ids, 0, False)
        slot = self._slots.get(key)
        if key in by_key:
            if slot is None or slot.output is not row.output_token_ids:
                # Rebuilding it a second time in one call would count the history twice.
                raise SamplingError(f"two rows share state key {key!r} with different histories")
            return slot
        if slot is None:
            slot = self._slots[key] = _Slot(self._take_index(), (), (), 0, False)
            reset.append(slot.index)
        if (
            slot.prompt is not row.prompt_token_ids
            or slot.output is not row.output_token_ids
            or len(row.output_token_ids) < slot.synced
        ):
            if slot.synced or slot.has_prompt:
                reset.append(slot.index)
            slot.prompt, slot.output = row.prompt_token_ids, row.output_token_ids
            slot.synced, slot.has_prompt = 0, False
        by_key[key] = slot
        return slot

    def _write(
        self,
        indices: list[int],
        reset: list[int],
        count_rows: list[int],
        count_tokens: list[int],
        prompt_rows: list[int],
        prompt_tokens: list[int],
        device: torch.device,
    ) -> PenaltyRows:
        counts, prompt_seen = self._counts, self._prompt_seen
        assert counts is not None  # _ensure_tables ran
        vocab = counts.shape[1]
        for tokens in (count_tokens, prompt_tokens):
            # Checked on the host: a bad index on a GPU is a device assert, not an error.
            if tokens and (min(tokens) < 0 or max(tokens) >= vocab):
                raise SamplingError(f"a token id is outside the vocabulary of {vocab}")
        if reset:
            where = torch.tensor(reset, dtype=torch.long, device=device)
            counts.index_fill_(0, where, 0)
            if prompt_seen is not None:
                prompt_seen.index_fill_(0, where, False)
        if count_tokens:
            # One host-to-device copy for every new token of the batch, one scatter.
            pairs = torch.tensor([count_rows, count_tokens], dtype=torch.long, device=device)
            ones = torch.ones(len(count_tokens), dtype=counts.dtype, device=device)
            counts.index_put_((pairs[0], pairs[1]), ones, accumulate=True)
        if prompt_tokens:
            assert prompt_seen is not None  # allocated when a row needs it
            pairs = torch.tensor([prompt_rows, prompt_tokens], dtype=torch.long, device=device)
            prompt_seen[pairs[0], pairs[1]] = True
        slots = torch.tensor(indices, dtype=torch.long, device=device)
        return PenaltyRows(slots, counts, prompt_seen)

    def _ensure_tables(self, vocab_size: int, device: torch.device, need_prompt: bool) -> None:
        counts = self._counts
        if counts is None or counts.shape[1] != vocab_size or counts.device != device:
            # First use, or another vocabulary/device: start over; histories rebuild slots.
            self._slots.clear()
            self._counts = torch.zeros(
                (self._initial, vocab_size), dtype=torch.float32, device=device
            )
            self._prompt_seen = None
            self._free = list(range(self._initial - 1, -1, -1))
        if need_prompt and self._prompt_seen is None:
            assert self._counts is not None
            self._prompt_seen = torch.zeros(self._counts.shape, dtype=torch.bool, device=device)

    def _take_index(self) -> int:
        if not self._free:
            counts = self._counts
            assert counts is not None  # _ensure_tables ran
            old = counts.shape[0]
            self._counts = _grown(counts, old * 2)
            if self._prompt_seen is not None:
                self._prompt_seen = _grown(self._prompt_seen, old * 2)
            self._free = list(range(old * 2 - 1, old - 1, -1))
        return self._free.pop()


def _grown(table: torch.Tensor, rows: int) -> torch.Tensor:
    grown = torch.zeros((rows, table.shape[1]), dtype=table.dtype, device=table.device)
    grown[: table.shape[0]] = table
    return grown
