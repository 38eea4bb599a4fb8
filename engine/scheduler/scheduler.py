"""Continuous batching under one token budget per step (after vLLM V1).

There is no prefill or decode phase: every running sequence's computed-token
count catches up with its known tokens, a chunk at a time, and all of them
share `max_num_batched_tokens`. The scheduler never touches tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet

from engine.config import SchedulerConfig
from engine.kv_cache.manager import KVCacheManager
from engine.lora.slots import AdapterSlots
from engine.scheduler.kv_shares import KVShares
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.scheduler.policies import make_waiting_queue
from engine.scheduler.prefill_shares import PrefillShares, PrefillSplit
from engine.scheduler.prompt_duty import PromptDuty
from engine.scheduler.queue import WaitingQueue
from engine.scheduler.step_budget import StepBudget
from engine.scheduler.tenants import TenantBook
from engine.scheduler.traffic import (
    BATCH_SLACK,
    BatchPace,
    InteractiveWaiting,
    batch_pace,
    interactive_waiting,
    newest_batch,
    same_class_or_below,
)
from engine.sequence import PENDING_TOKEN, Sequence, SequenceStatus

# Bounds the sequences one step passes over while they wait for an adapter slot.
MAX_HELD = 64


class Scheduler:
    """Owns the waiting and running sequences and decides each step's batch."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        *,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        waiting: WaitingQueue | None = None,
        adapter_slots: AdapterSlots | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        # Per tenant (fairness key): weights, counts, shares of the waiting slots.
        self.tenants = TenantBook(dict(config.domain_weights))
        self.waiting: WaitingQueue = (
            waiting if waiting is not None else make_waiting_queue(config, kv, self.tenants)
        )
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Per tenant in the running set: weighted KV shares, quotas, preemption counts.
        self.kv_shares = KVShares(self.tenants, kv, enabled=config.kv_shares)
        self.adapter_slots = adapter_slots
        itl_budget_s = None if config.itl_budget_ms is None else config.itl_budget_ms / 1000
        self.step_budget = StepBudget(itl_budget_s, config.max_num_batched_tokens)
        self._prefill_left = config.max_num_batched_tokens  # this step's, while scheduling
        # Which tenants share the step's prompt tokens (those with work, and a grace).
        self.prefill_split = PrefillSplit()
        # Batch work alone splits among its own tenants: their grace never reaches
        # interactive work's split (a batch tenant is no party to it, _split_parties).
        self.batch_prefill_split = PrefillSplit()
        # Which tenants' prompt chunks sit out steps that carry others' decodes.
        self.prompt_duty = PromptDuty()
        self._prompted: set[str] = set()  # tenants with prompt chunks in the last step
        self._rows_held: set[str] = set()  # tenants whose running sequences sat it out
        # Whether a running sequence can take part in the next step; the engine sets it to
        # its grammar matchers' (a sequence whose next mask is still being filled waits)
        # and the KV manager's (one whose blocks a tier still loads waits). A sequence
        # admitted not ready keeps its blocks and runs from the first step it is ready.
        self.seq_ready: Callable[[Sequence], bool] = _always_ready
        # This step's interactive waiting sequences, counted while scheduling.
        self._interactive = InteractiveWaiting(0, frozenset())
        self._pace: BatchPace | None = None  # this step's allowance for batch work
        self._batch_tokens_left = 0  # of the allowance's prompt tokens, while scheduling
        self._batch_turn = 0  # rotates which batch rows a paced step carries

    # -- queue ------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queues a validated sequence for admission."""
        seq.status = SequenceStatus.WAITING
        self.tenants.arrived(seq)
        self.waiting.push(seq)

    def set_weight(self, key: str, weight: float) -> None:
        """Sets a tenant's share (fair ordering and waiting slots) while it has work."""
        self.tenants.set_weight(key, weight)

    def make_room(self, key: str, n: int, weight: float | None = None) -> list[str] | None:
        """Before `n` sequences of `key` (share `weight`) are queued: request ids to refuse
        to make room (usually none), or None when it is `key`'s request that is refused."""
        capacity = self.config.max_waiting
        if self.num_waiting < capacity:
            return []
        need = self.num_waiting - capacity + 1
        return self.tenants.make_room(key, n, need, capacity, weight=weight)

    def has_unfinished(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.running) or len(self.waiting) > 0

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (preempted ones included)."""
        return len(self.waiting)

    # -- one step ---------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Picks this step's sequences and token counts; allocates their KV slots."""
        budget = self.config.max_num_batched_tokens
        self._prefill_left = self.step_budget.prefill_cap()
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []

        self._begin_adapter_step()
        self._interactive = interactive_waiting(self.waiting)
        self._pace = self._batch_pace()
        self._batch_tokens_left = 0 if self._pace is None else self._pace.prompt_tokens
        shares, held = self._prefill_shares()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.fairness_key in held or self._adapter_wait(seq) or not self.seq_ready(seq):
                i += 1
                continue
            num_new = self._chunk(seq, budget)
            if seq.batch and (num_new > 1 and self._interactive.count or self._paced(seq)):
                i += 1  # batch work waits while interactive work queues, or sits its turn out
                continue
            if seq.batch and self._pace is not None and num_new > 1:
                num_new = min(num_new, self._batch_tokens_left)
                if num_new == 0:
                    i += 1
                    continue
            if num_new > 1:
                num_new = shares.cap(seq.fairness_key, num_new)
            if num_new == 0:  # a prompt chunk, and this step's prefill is spent
                i += 1
                continue
            draft = self._draft(seq, num_new, budget)
            if draft:
                scheduled.append(
                    ScheduledSequence(seq, seq.num_computed_tokens, 1 + len(draft), draft)
                )
                budget -= 1 + len(draft)
                i += 1
                continue
            while not self._fits_quota(seq, num_new) or not self.kv.allocate_slots(seq, num_new):
                victim = self._victim(seq, num_new)
                budget += self._preempt_running(victim, seq, scheduled, preempted)
                if victim is seq:
                    break
                if self.running.index(seq) < i:
                    i -= 1  # the victim stood before `seq` in the running list
            else:
                scheduled.append(ScheduledSequence(seq, seq.num_computed_tokens, num_new))
                budget -= num_new
                if seq.batch and num_new > 1:
                    self._batch_tokens_left = max(0, self._batch_tokens_left - num_new)
                self._spend_prefill(num_new)
                if num_new > 1:
                    shares.spend(seq.fairness_key, num_new)
                i += 1

        # Admitting while the pool is short would only preempt again next step, but for
        # a tenant within its KV share: the preemptions were made on tenants over theirs,
        # and its sequence is not the next victim. (A newcomer waiting behind a squeezed
        # attacker would otherwise wait one more step each time the attacker hits the
        # pool's end.)
        if not preempted:
            budget = self._admit(budget, scheduled, shares, preempted)
        elif self.kv_shares.enabled:
            budget = self._admit(budget, scheduled, shares, preempted, within_share=True)

        self._prompted = {i.seq.fairness_key for i in scheduled if i.num_prompt_tokens}
        self._rows_held = held
        return SchedulerOutput(
            scheduled=tuple(scheduled),
            num_batched_tokens=self.config.max_num_batched_tokens - budget,
            preempted=tuple(preempted),
        )

    def _batch_pace(self) -> BatchPace | None:
        """This step's allowance for batch work beside interactive work (traffic.py)."""
        if newest_batch(self.running) is None and self._interactive.count == len(self.waiting):
            return None  # no batch work at all
        rows = sum(1 for s in self.running if not s.batch)
        pace = batch_pace(
            self.running, self._batch_turn, self.step_budget.extra_within(rows, BATCH_SLACK)
        )
        if pace is not None:
            self._batch_turn += len(pace.rows)
        return pace

    def _paced(self, seq: Sequence) -> bool:
        """Whether running batch `seq` sits this step out (not its turn)."""
        return self._pace is not None and seq.seq_id not in self._pace.rows

    def _prefill_shares(self) -> tuple[PrefillShares, set[str]]:
        """This step's contended prompt-token cap split among the tenants with work
        (shares off: one part for all, the whole cap), and the tenants whose running
        sequences sit this step out for a newcomer's first chunk."""
        if not self.kv_shares.enabled:
            return PrefillShares(self._prefill_left, (), self.tenants.weight), set()
        decoding = [s for s in self.running if s.num_tokens - s.num_computed_tokens == 1]
        split, running, waiting_keys = self._split_parties()
        cap = min(self._prefill_left, self.step_budget.contended_cap(len(decoding)))
        shares = split.shares(cap, running, waiting_keys, self.tenants.weight)
        # Resting matters only beside another tenant's interactive decodes; holding a
        # tenant with nobody else decoding would leave the step empty for nothing, and
        # batch work runs in what interactive work leaves, so its decodes hold no one.
        decoders = {s.fairness_key for s in decoding if not s.batch}
        shares.hold(k for k in self.prompt_duty.resting() if decoders - {k})
        newcomers = self._newcomers()
        if not newcomers:
            return shares, set()
        owed = min(self.waiting.served(k) or 0.0 for k in newcomers)
        ahead = {
            k
            for k in {*self._prompted, *(s.fairness_key for s in self.running)}
            if k not in newcomers and (self.waiting.served(k) or 0.0) >= owed
        }
        shares.hold(ahead & self._prompted)
        # A step's cost grows with its rows (on a CPU, two rows can cost nearly twice
        # one), and the newcomer's first token waits for the whole step: the tenants
        # served more sit it out, but never two steps running, and not while the pool
        # is full (the newcomer then gets its blocks from a step in which they grow).
        if self.kv.pool.num_free == 0:
            return shares, set()
        return shares, ahead - self._rows_held

    def _split_parties(self) -> tuple[PrefillSplit, list[Sequence], AbstractSet[str]]:
        """The split, running sequences and waiting tenants the prompt tokens are split
        among: while interactive work runs or waits, only it. Batch prompt tokens beside
        it come from the pace's allowance (traffic.py); a part for a batch tenant would
        halve an interactive prompt's chunks and lengthen its time to first token."""
        running = [s for s in self.running if not s.batch]
        # The queue is as it was when this step counted its interactive sequences.
        if running or self._interactive.keys:
            return self.prefill_split, running, self._interactive.keys
        return self.batch_prefill_split, self.running, set(self.tenants.waiting)

    def _newcomers(self) -> set[str]:
        """Tenants with nothing running and a request never admitted, under a policy that
        orders tenants by service: their first chunks go without the prompt chunks of
        tenants served as much or more that had some in the step before."""
        if len(self.running) >= self.config.max_num_seqs:
            return set()
        running = {s.fairness_key for s in self.running}
        return {
            k
            for k in self.tenants.waiting
            if k not in running and self.tenants.has_fresh(k) and self.waiting.served(k) is not None
        }

    def _fits_quota(self, seq: Sequence, num_new: int) -> bool:
        """Whether `num_new` more tokens of running `seq` keep its tenant within quota."""
        if self.kv_shares.quota(seq.fairness_key) is None:
            return True
        # Blocks behind a sliding window were given back: they no longer count.
        total = self.kv.blocks_needed(seq.num_computed_tokens + num_new) - seq.num_released_blocks
        used = sum(s.num_held_blocks for s in self.running if s.fairness_key == seq.fairness_key)
        return not self.kv_shares.over_quota(seq, total, used)

    def _victim(self, seq: Sequence, num_new: int) -> Sequence:
        """Whom to preempt so that running `seq` can take `num_new` more tokens: its own
        tenant's newest when its quota binds, else by KV share (shares off: the newest)."""
        if not self._fits_quota(seq, num_new):
            own = self.kv_shares.own_victim(self.running, seq.fairness_key)
            if own is not None:
                return own if own.batch or not seq.batch else seq
        batch = newest_batch(self.running)
        if batch is not None and not seq.batch:
            return batch  # interactive work never waits for batch work
        return self.kv_shares.victim(same_class_or_below(self.running, seq), seq)

    def _preempt_running(
        self,
        victim: Sequence,
        requester: Sequence,
        scheduled: list[ScheduledSequence],
        preempted: list[Sequence],
    ) -> int:
        """Preempts a running sequence; one already scheduled this step is taken out of
        the batch. Returns the step budget that gives back."""
        given_back = 0
        for j, item in enumerate(scheduled):
            if item.seq is victim:
                del scheduled[j]
                given_back = item.num_new_tokens
                self._prefill_left += item.num_prompt_tokens
                break
        self.running.remove(victim)
        self._preempt(victim)
        self.kv_shares.preempted(victim, requester)
        preempted.append(victim)
        return given_back

    def _admit(
        self,
        budget: int,
        scheduled: list[ScheduledSequence],
        shares: PrefillShares,
        preempted: list[Sequence],
        *,
        within_share: bool = False,
    ) -> int:
        """Admits waiting sequences in fair order while the step has room; returns what is
        left of the step's budget. `within_share`: only those whose tenants stay within
        their KV shares. Batch sequences wait while interactive ones do; an interactive
        one takes a seat or blocks from running batch work (`preempted` lists them)."""
        # Sequences whose adapter waits for a slot: passed over this step, still in the
        # queue at their place in fair order, so they are asked first again next step.
        held: set[str] = set()
        # Tenants passed over this step (over their KV share or quota), and the ids of
        # their waiting sequences, which the queue skips.
        held_keys: set[str] = set()
        skip: set[str] = set()
        gate = self.kv_shares.admission_gate(self.running)
        # Batch blocks are no interactive tenant's share: they give way (traffic.py).
        interactive = [s for s in self.running if not s.batch]
        first = (
            gate
            if len(interactive) == len(self.running)
            else (self.kv_shares.admission_gate(interactive))
        )
        interactive_left = self._interactive.count
        while budget > 0:
            full = len(self.running) >= self.config.max_num_seqs
            if full and newest_batch(self.running) is None:
                break  # (a full engine peeks at nobody: a peek may plan a lookup)
            seq = self.waiting.peek(skip | held if held else skip)
            if seq is None:
                break
            if seq.batch and interactive_left:
                skip.add(seq.seq_id)
                continue
            if full and seq.batch:
                break
            if seq.batch and self._pace is not None and self._batch_tokens_left == 0:
                skip.add(seq.seq_id)  # the step has no room for more batch prompt
                continue
            if not self._place_adapter(seq):
                held.add(seq.seq_id)
                if len(held) >= MAX_HELD:
                    break
                continue
            computed_blocks: list[int] = []
            num_computed = 0
            if seq.use_cache and not seq.block_ids:
                computed_blocks, num_computed = self.kv.get_computed_blocks(seq)
                if self.kv.prefix_in_flight(seq, num_computed):
                    # Its domain computes its next blocks this very step: it adopts
                    # them once cached instead of computing them twice.
                    skip.add(seq.seq_id)
                    continue
            seq.num_computed_tokens = num_computed
            num_new = self._chunk(seq, budget)
            if seq.batch and self._pace is not None:
                num_new = min(num_new, self._batch_tokens_left)
            if num_new == 0:  # this step's prefill is spent
                seq.num_computed_tokens = 0
                break
            key = seq.fairness_key
            if num_new > 1:
                num_new = shares.cap(key, num_new)
            total = self.kv.blocks_needed(num_computed + num_new)
            waiting_keys = (k for k in self.tenants.waiting if k not in held_keys)
            # Its part of the step's prompt tokens spent (it still waits for KV), or over
            # its KV share: the tenant is passed over this step.
            spent = num_new == 0
            seq_gate = gate if seq.batch else first
            over = within_share and not seq_gate.within_share(seq, total)
            if spent or over or not seq_gate.allows(seq, total, waiting_keys):
                seq.num_computed_tokens = 0
                if not spent:
                    held_keys.add(key)
                skip.update(s.seq_id for s in self.waiting if s.fairness_key == key)
                continue
            seat = newest_batch(self.running) if full else None
            if seat is not None:  # interactive work takes a seat from batch work
                budget += self._preempt_running(seat, seq, scheduled, preempted)
            given_back = self._allocate_admitted(
                seq, num_new, computed_blocks, scheduled, preempted
            )
            if given_back is None:
                seq.num_computed_tokens = 0
                break
            budget += given_back
            if not seq.batch:
                interactive_left -= 1
                if first is not gate:
                    first.admitted(seq, total)
            gate.admitted(seq, total)
            self.waiting.pop(seq)
            self.tenants.admitted(seq)
            if not seq.admitted_once:
                seq.admitted_once = True
                seq.num_cached_tokens = num_computed
                self.waiting.charge(seq, seq.num_prompt_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if not self.seq_ready(seq):
                continue  # admitted (its blocks reserved) but its cached blocks are loading
            scheduled.append(ScheduledSequence(seq, seq.num_computed_tokens, num_new))
            budget -= num_new
            if seq.batch and self._pace is not None:
                self._batch_tokens_left = 0  # one batch admission a paced step
            self._spend_prefill(num_new)
            if num_new > 1:
                shares.spend(key, num_new)
        return budget

    def _allocate_admitted(
        self,
        seq: Sequence,
        num_new: int,
        computed_blocks: list[int],
        scheduled: list[ScheduledSequence],
        preempted: list[Sequence],
    ) -> int | None:
        """KV slots for a sequence being admitted; an interactive one preempts running
        batch sequences, newest first, until they fit. Returns the step budget the
        preempted ones give back, or None when the slots cannot be had."""
        given_back = 0
        while not self.kv.allocate_slots(seq, num_new, computed_blocks):
            victim = None if seq.batch else newest_batch(self.running)
            if victim is None:
                return None
            given_back += self._preempt_running(victim, seq, scheduled, preempted)
        return given_back

    def _draft(self, seq: Sequence, num_new: int, budget: int) -> tuple[int, ...]:
        """The draft tokens a decoding `seq` carries this step, with their KV slots
        allocated (the known token's too); () for a plain row.

        Drafts are a bet: they take only the step's spare budget and free blocks,
        never another tenant's cached blocks nor a preemption, and stay within the
        tenant's KV quota; whatever does not fit is cut from the draft's end.
        """
        if num_new != 1 or not seq.spec_token_ids:
            return ()
        if seq.num_tokens - seq.num_computed_tokens != 1:
            return ()
        held = len(seq.block_ids) + self.kv.pool.num_uncached_free
        room = held * self.kv.block_size - seq.num_computed_tokens - 1
        count = min(len(seq.spec_token_ids), budget - 1, room)
        while count > 0 and not self._fits_quota(seq, 1 + count):
            count -= 1
        if count <= 0 or not self.kv.allocate_slots(seq, 1 + count):
            return ()
        return tuple(seq.spec_token_ids[:count])

    def _place_adapter(self, seq: Sequence) -> bool:
        """Gives a LoRA sequence its adapter's slot and pins the adapter for it; False while
        the adapter waits for a slot (it is in line for one)."""
        if seq.adapter_digest is None:
            return True
        slots = self.adapter_slots
        assert slots is not None and seq.adapter is not None
        seq.lora_slot = slots.place(seq.adapter)
        if seq.lora_slot is None:
            return False
        slots.pin(seq.seq_id, seq.adapter)
        return True

    def _adapter_wait(self, seq: Sequence) -> bool:
        """True when a running LoRA sequence sits this step out: its adapter gave its slot to
        another for now. Else its `lora_slot` is this step's (slots move between steps)."""
        if seq.adapter_digest is None or self.adapter_slots is None:
            return False
        assert seq.adapter is not None
        seq.lora_slot = self.adapter_slots.slot(seq.adapter)
        return seq.lora_slot is None

    def _begin_adapter_step(self) -> None:
        slots = self.adapter_slots
        if slots is None:
            return
        wanted: set[str] = set()
        if slots.wanting:
            live = (*self.running, *self.waiting)
            wanted = {s.adapter for s in live if s.adapter and s.adapter_digest is not None}
        slots.begin_step(wanted)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """Tokens to compute for `seq` now: what is left, capped by budget and chunk size,
        and a prompt's chunk by what is left of this step's prefill cap (may be 0)."""
        left = seq.num_tokens - seq.num_computed_tokens
        if left > 1:
            cap = self.config.prefill_chunk_size
            if cap is not None:
                left = min(left, cap)
            left = min(left, self._prefill_left)
        return min(left, budget)

    def _spend_prefill(self, num_new: int) -> None:
        if num_new > 1:
            self._prefill_left -= num_new

    def observe_step(self, output: SchedulerOutput, elapsed_s: float) -> None:
        """Feeds one finished step's wall time to the ITL budget's cost estimates."""
        if not self.step_budget.enabled:
            return
        prefill = sum(i.num_new_tokens for i in output.scheduled if i.num_new_tokens > 1)
        decodes = sum(1 for i in output.scheduled if i.num_new_tokens == 1)
        self.step_budget.observe(prefill, decodes, elapsed_s)
        if self.kv_shares.enabled:
            self.prompt_duty.observe_step(output, elapsed_s, self.step_budget)

    def requeue(self, seqs: Iterable[Sequence]) -> None:
        """Preempts running `seqs` between steps (their cached KV was found bad, e.g. a
        tier load into their blocks failed): each is recomputed when admitted again."""
        for seq in seqs:
            if seq in self.running:
                self.running.remove(seq)
                self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Frees a running sequence's blocks; it will be recomputed from scratch (its block
        keys are kept: its tokens are the same)."""
        self.kv.free(seq, keep_keys=True)
        seq.num_computed_tokens = 0
        seq.num_unsettled_tokens = 0
        # A token an in-flight step still samples is dropped: recomputation samples it
        # again, and nothing is hashed or admitted with a placeholder in it.
        seq.drop_pending_token()
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.num_preemptions += 1
        self.tenants.requeued(seq)
        self.waiting.push_front(seq)

    # -- after the step -----------------------------------------------------------

    def update(self, output: SchedulerOutput, sampled: dict[str, int]) -> list[Sequence]:
        """Advances computed counts, appends sampled tokens and finishes sequences.

        Returns the sequences that received a token this step.
        """
        return [
            item.seq
            for item in output.scheduled
            if self.update_one(item, sampled.get(item.seq.seq_id))
        ]

    def update_one(self, item: ScheduledSequence, token: int | None) -> bool:
        """`update` for one scheduled sequence; True when it received `token`.

        A sequence finished while the step ran (aborted, or its request failed) is
        left alone, and so is one that did not sample (`token` None).
        """
        seq = item.seq
        if seq.is_finished:
            return False
        seq.num_computed_tokens = item.end
        self.kv.cache_full_blocks(seq)
        self.kv.release_behind_window(seq)
        if token is None:
            return False
        seq.output_token_ids.append(token)
        self._took(seq, token)
        return True

    def advance_one(self, item: ScheduledSequence, samples: bool) -> None:
        """Overlap scheduling, when a step is launched: counts its tokens as computed and,
        for a row that `samples`, holds the place of its token with `PENDING_TOKEN`, so
        the next step can be scheduled before this one's result is known."""
        seq = item.seq
        if seq.is_finished:
            return
        seq.num_computed_tokens = item.end
        seq.num_unsettled_tokens = item.num_new_tokens
        if samples:
            seq.output_token_ids.append(PENDING_TOKEN)

    def settle_one(self, item: ScheduledSequence, token: int | None) -> bool:
        """Overlap scheduling, when a launched step's result is taken: `update_one` for a
        row `advance_one` advanced. True when the sequence received `token`.

        A sequence preempted since the launch dropped its placeholder (`_preempt`): its
        token is not taken, and it is sampled again when recomputed.
        """
        seq = item.seq
        if seq.is_finished:
            return False
        seq.num_unsettled_tokens = 0
        if seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens >= item.end:
            self.kv.cache_full_blocks(seq)  # the step's K/V are written now
            # Only now: a failed launched step is run again from its start, and reads
            # the window behind it.
            self.kv.release_behind_window(seq)
        if token is None or not seq.has_pending_token:
            seq.drop_pending_token()
            return False
        seq.output_token_ids[-1] = token
        self._took(seq, token)
        return True

    def rewind_one(self, item: ScheduledSequence) -> None:
        """Overlap scheduling: undoes `advance_one` for a launched step that failed (it is
        then run again synchronously)."""
        seq = item.seq
        seq.drop_pending_token()
        seq.num_unsettled_tokens = 0
        if seq.status is SequenceStatus.RUNNING and seq.num_computed_tokens == item.end:
            seq.num_computed_tokens = item.start

    def _took(self, seq: Sequence, token: int) -> None:
        """Charges a sequence's new output token and ends the sequence if it stops there."""
        self.waiting.charge(seq, 2)  # an output token weighs two prompt tokens (VTC)
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self.finish(seq, *reason)

    def _stop_reason(self, seq: Sequence, token: int) -> tuple[str, int | None] | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if token in params.stop_token_ids:
                return "stop", token
            if not params.ignore_eos and token in self.eos_token_ids:
                return "stop", token
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length", None
        return None

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Ends a sequence wherever it is and frees its blocks at once."""
        if seq.is_finished:
            return
        seq.drop_pending_token()  # its request's outputs never show a placeholder
        was_waiting = seq.status is not SequenceStatus.RUNNING
        if was_waiting:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        if self.tenants.finished(seq, was_waiting=was_waiting):
            self.waiting.forget(seq.fairness_key)
        self.kv.free(seq)
        if not self.running and len(self.waiting) == 0:
            self.prefill_split.clear()
            self.batch_prefill_split.clear()
            self.prompt_duty.clear()
        if seq.adapter_digest is not None and self.adapter_slots is not None:
            assert seq.adapter is not None
            self.adapter_slots.release(seq.seq_id, seq.adapter)
            seq.lora_slot = None
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        seq.num_computed_tokens = 0

    def finish_all(self, seqs: Iterable[Sequence], reason: str) -> None:
        """Ends several sequences (an aborted request's samples)."""
        for seq in seqs:
            self.finish(seq, reason)


def _always_ready(seq: Sequence) -> bool:
    """Every running sequence may take part in a step."""
    return True
