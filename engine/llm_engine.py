"""The synchronous engine core: step = schedule -> run -> postprocess."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence as Seq
from typing import Any

from engine.config import EngineConfig
from engine.engine_builder import build_config, build_engine_parts
from engine.errors import EngineError, EngineOverloadedError, InvalidRequestError
from engine.fronts.step_isolation import execute_isolated
from engine.kv_cache.cache_rules import CacheRules
from engine.kv_cache.host_tier import HostTier
from engine.lora.peft import AdapterInfo
from engine.lora.registry import located
from engine.model.loader import LoadedModel
from engine.outputs import StreamEvent
from engine.overlap import OverlapStepper
from engine.request import EngineRequest, check_adapter_name
from engine.request_state import RequestState
from engine.runner.model_runner import SampledToken
from engine.sampling_params import SamplingParams
from engine.scheduler.output import ScheduledSequence, SchedulerOutput
from engine.sequence import Sequence
from engine.stats import EngineStats
from engine.validation import (
    check_kv_quota,
    kv_tokens_held,
    validate_request,
    window_peak_tokens,
)

log = logging.getLogger("engine")

# The longest an empty step waits for a grammar mask being filled ahead (new requests
# wait at most this long behind it).
EMPTY_STEP_WAIT_S = 0.01


class LLMEngine:
    """Owns the model runner, the scheduler and the state of every live request.

    Not thread-safe: one thread drives `step()`; `AsyncEngine` wraps it for asyncio.
    Its parts (model, KV cache, tiers, runner, scheduler, ...) are built by
    `engine.engine_builder.build_engine_parts`; this class runs the step over them.
    """

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel | None = None,
        *,
        keep_finished: bool = False,
    ) -> None:
        self.config = config
        # The offline LLM collects finished requests from here; a server streams events instead.
        self.keep_finished = keep_finished
        self.finished: dict[str, RequestState] = {}
        parts = build_engine_parts(config, loaded)
        self.loaded = parts.loaded
        self.tokenizer = parts.loaded.tokenizer
        self.arch = parts.loaded.arch
        self.model_name = parts.loaded.name
        self.max_model_len = parts.max_model_len
        self.capacity = parts.capacity
        self.kv = parts.kv
        self.grammars = parts.grammars
        self.lora = parts.lora
        self.scheduler = parts.scheduler
        self.runner = parts.runner
        self.host_kv = parts.host_kv
        self.tier_cost = parts.tier_cost
        self.tier_io = parts.tier_io
        self.speculator = parts.speculator
        self.kv_events = parts.kv_events
        # Step N+1 prepared while step N runs (engine/overlap.py); None: every step in turn.
        self.overlap: OverlapStepper | None = None
        if config.scheduler.overlap_scheduling and self.speculator is None and self.kv.tier is None:
            self.overlap = OverlapStepper(self)
        self.requests: dict[str, RequestState] = {}
        # Requests refused after they were queued, to make room for a tenant under its
        # share of the waiting slots; the caller reports them (`take_refused`).
        self._refused: list[tuple[str, EngineOverloadedError]] = []
        self._num_finished = 0
        self._num_generated = 0
        self._num_prompt = 0  # prompt tokens of requests that sampled their first token
        self._failures: list[tuple[str, Exception]] = []
        if self.kv_events is not None:
            self._publish_kv_events()  # AllBlocksCleared: this engine holds no block yet

    @classmethod
    def from_options(cls, model: str | None = None, **options: Any) -> LLMEngine:
        """`LLMEngine.from_options(model=None, block_size=16, ...)`."""
        return cls(build_config(model, **options))

    @property
    def vocab_size(self) -> int:
        """Rows of the model's output layer."""
        return self.arch.vocab_size

    @property
    def window_peak_tokens(self) -> int | None:
        """The most KV tokens one sequence holds at once on a model whose every layer
        has a window (engine.validation.window_peak_tokens); None without one."""
        cfg = self.config.scheduler
        step = min(cfg.max_num_batched_tokens, cfg.prefill_chunk_size or cfg.max_num_batched_tokens)
        return window_peak_tokens(self.kv.window, self.kv.block_size, step)

    # -- requests ---------------------------------------------------------------

    def validate(self, prompt_token_ids: Seq[int], params: SamplingParams) -> int:
        """Raises a typed error for a bad request; returns its resolved max_tokens. Pure."""
        cfg = self.config.scheduler
        return validate_request(
            prompt_token_ids,
            params,
            vocab_size=self.vocab_size,
            max_model_len=self.max_model_len,
            pool_tokens=self.capacity.num_tokens,
            max_n=cfg.max_n,
            max_tokens_limit=cfg.max_tokens_limit,
            max_waiting=cfg.max_waiting,
            window_peak=self.window_peak_tokens,
        )

    def add_request(
        self,
        request: EngineRequest,
        *,
        arrival_time: float | None = None,
        validated_max_tokens: int | None = None,
    ) -> str:
        """Queues a request; raises at once if it is bad or the queue is full.

        The request's constructor is the one place its fields are checked. Its fairness
        key (the tenant) is whose share of the scheduler it uses, its weight that share.
        When the waiting queue is full, a tenant under its share of the slots takes one
        back from the tenant most over its share, whose newest requests are refused (see
        `take_refused`). `validated_max_tokens` is for a caller that already ran
        `validate` on this very request (the fronts, on their caller's thread): pass what
        it returned and the checks against the engine's limits are not repeated. The
        limits they read are fixed for the engine's life, so the earlier answer still
        holds.
        """
        params = request.params
        digest = None if request.adapter is None else self.adapter(request.adapter).digest
        if validated_max_tokens is None:
            max_tokens = self.validate(request.prompt_token_ids, params)
        else:
            max_tokens = validated_max_tokens
        if params.structured is not None:
            # A cache hit when a front prepared it (EngineLoop waits for that); else the
            # offline caller's own thread waits for the compile.
            self.grammars.compile(params.structured, request.cache_domain)
        request_id = request.request_id
        if request_id in self.requests:
            raise InvalidRequestError(
                f"request id {request_id!r} is already live", param="request_id"
            )
        key, weight = request.fairness_key, request.weight
        # Again here: the front checked against the rules it knew, which may be older.
        check_kv_quota(
            kv_tokens_held(len(request.prompt_token_ids) + max_tokens, self.window_peak_tokens),
            self.kv.kv_quota(key),
            self.kv.block_size,
        )
        room = self.scheduler.make_room(key, params.n, weight)
        if room is None:
            raise EngineOverloadedError(
                f"the waiting queue is full ({self.config.scheduler.max_waiting} requests)"
            )
        for victim in room:
            self._refuse(victim)
        if weight is not None:
            self.scheduler.set_weight(key, weight)
        now = arrival_time if arrival_time is not None else time.time()
        prompt_ids = list(map(int, request.prompt_token_ids))
        seqs = [
            Sequence(
                seq_id=f"{request_id}#{i}",
                request=request,
                index=i,
                prompt_token_ids=prompt_ids,
                max_tokens=max_tokens,
                adapter_digest=digest,
                arrival_time=now,
            )
            for i in range(params.n)
        ]
        self.requests[request_id] = RequestState(
            request_id, request.prompt, prompt_ids, seqs, self.tokenizer, now
        )
        for seq in seqs:
            self.scheduler.add(seq)
        return request_id

    def _refuse(self, request_id: str) -> None:
        """Ends a queued request to make room; its owner gets `EngineOverloadedError`."""
        state = self.requests.pop(request_id)
        self.scheduler.finish_all(state.seqs, "abort")
        for seq in state.seqs:
            self._release(seq.seq_id)
        self._refused.append(
            (
                request_id,
                EngineOverloadedError(
                    "the waiting queue is full and this tenant holds more than its share of it"
                ),
            )
        )

    def take_refused(self) -> list[tuple[str, EngineOverloadedError]]:
        """Requests refused after queueing since the last call, with their errors."""
        refused, self._refused = self._refused, []
        return refused

    def publish_prefix(self, token_ids: Seq[int]) -> int:
        """Shares a prefix (e.g. the platform's system prompt) with every cache domain.

        Returns the number of full blocks shared; tokens after them stay per domain.
        """
        return self.kv.publish_prefix([int(t) for t in token_ids])

    def update_cache_rules(self, rules: CacheRules) -> None:
        """Replaces the per-domain cache rules and the pushed published prefixes.

        Takes effect for the next lookup; see `KVCacheManager.apply_rules`.
        """
        self.kv.apply_rules(rules)
        self._publish_kv_events()  # withdrawn published blocks may have been evicted

    # -- adapters -----------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Reads a PEFT LoRA adapter folder and serves it as `name` from the next step.

        Loading a name again replaces its weights (refused with AdapterInUseError while
        requests use it); InvalidAdapterError when the folder does not fit this model.
        """
        check_adapter_name(name)
        return self._located(self.lora.load(name, path, self._live_seqs()))

    def unload_adapter(self, name: str) -> None:
        """Stops serving an adapter; AdapterInUseError while a live request uses it."""
        self.lora.unload(name, self._live_seqs())

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters, by name, each with where its weights are now."""
        return [self._located(info) for info in self.lora.registry.all()]

    def _located(self, info: AdapterInfo) -> AdapterInfo:
        """`info` with where its weights are now (a device slot, host memory or disk)."""
        return located(info, self.lora.slots.resident, self.lora.registry.host_resident())

    def adapter(self, name: str) -> AdapterInfo:
        """One loaded adapter; AdapterNotFoundError (code adapter_not_found) if unknown."""
        return self.lora.registry.info(name)

    def _live_seqs(self) -> list[Sequence]:
        return [seq for state in self.requests.values() for seq in state.seqs]

    def abort(self, request_id: str) -> StreamEvent | None:
        """Ends a request now and frees its blocks; returns its final event, if it was live."""
        state = self.requests.get(request_id)
        if state is None:
            return None
        self.scheduler.finish_all(state.seqs, "abort")
        return self._finalize(state, time.time())

    def fail_requests(self, request_ids: Seq[str]) -> None:
        """Drops requests whose step failed, freeing their blocks (the engine goes on)."""
        for request_id in request_ids:
            state = self.requests.pop(request_id, None)
            if state is not None:
                self.scheduler.finish_all(state.seqs, "error")
                for seq in state.seqs:
                    self._release(seq.seq_id)

    def _release(self, seq_id: str) -> None:
        """Forgets what the runner and the speculator kept for a sequence that ended."""
        self.runner.release(seq_id)
        if self.speculator is not None:
            self.speculator.release(seq_id)

    def has_unfinished(self) -> bool:
        """True while any request is live."""
        return bool(self.requests)

    # -- the step -----------------------------------------------------------------

    def step(self) -> list[StreamEvent]:
        """Schedules, runs and post-processes one step; returns the events it produced.

        A request that makes the step raise is failed alone (see `engine.fronts.step_isolation`),
        and so is one whose post-processing raises: the others carry on. Failed
        requests are dropped with their blocks freed; `take_failures` hands them over.
        """
        started = time.perf_counter()
        try:
            if self.overlap is not None:
                return self.overlap.step(started)
            if self.speculator is not None:
                self.speculator.prepare(self.scheduler.running)
            if self.tier_io is not None:
                self.tier_io.join(self._requeue_over)  # loads that ended: blocks ready
            output = self.scheduler.schedule()
            if self.tier_io is not None and self.kv.tier is not None:
                # Before the scrub and the forward pass: write-backs read blocks about to
                # be reused; loads (into blocks no scheduled row reads) go to the worker.
                self.tier_io.run(self.kv.tier.take_ops())
            return self.run_scheduled(output, started)
        finally:
            self._publish_kv_events()

    def run_scheduled(
        self,
        output: SchedulerOutput,
        started: float,
        unreadable: dict[str, EngineError] | None = None,
    ) -> list[StreamEvent]:
        """Runs a scheduled step synchronously and takes its tokens; `unreadable`: the
        adapters `LoraManager.prepare_step` could not read, when it was called already."""
        if output.is_empty:
            # Every running sequence waits for its next grammar mask or for a tier
            # load: wait for one rather than spin (the loop steps again at once).
            if self.tier_io is not None and self.tier_io.busy:
                self.tier_io.wait_any(EMPTY_STEP_WAIT_S)
            self.runner.matchers.wait_ahead(EMPTY_STEP_WAIT_S)
            return []
        generated = self._num_generated
        events = self._run_step(output, unreadable)
        elapsed = time.perf_counter() - started
        self.observe_step(output, elapsed)
        if self.speculator is not None:
            self.speculator.observe_step(output, self._num_generated - generated, elapsed)
        return events

    def observe_step(self, output: SchedulerOutput, elapsed: float) -> None:
        """Feeds a step's cost to what learns from it: the step budget and the host tier's
        load-or-recompute rule."""
        self.scheduler.observe_step(output, elapsed)
        if self.tier_cost is not None and any(i.num_prompt_tokens for i in output.scheduled):
            # What recomputing a token costs, for the host tier's load-or-recompute rule.
            tokens = sum(i.num_new_tokens for i in output.scheduled)
            self.tier_cost.observe_prefill(tokens, elapsed)

    def _publish_kv_events(self) -> None:
        """Hands the cache's changes since the last call to the KV events publisher."""
        if self.kv_events is not None and self.kv.events is not None:
            batch = self.kv.events.take()
            if batch is not None:
                self.kv_events.publish(batch)

    def close(self) -> None:
        """Releases what outlives a step: the KV events publisher's socket and thread, and
        the disk tier's writer (its queued writes finish first)."""
        if self.overlap is not None:
            self.overlap.close()
        if self.tier_io is not None:
            self.tier_io.close(self._requeue_over)
        if isinstance(self.kv.tier, HostTier):
            self.kv.tier.close()
        if self.kv_events is not None:
            self._publish_kv_events()
            self.kv_events.close()
            self.kv_events = None

    def _requeue_over(self, blocks: set[int]) -> None:
        """Sends the running sequences holding `blocks` (a failed tier load) back to be
        recomputed, with fresh block-table rows."""
        over = [s for s in self.scheduler.running if not blocks.isdisjoint(s.held_block_ids)]
        self.scheduler.requeue(over)
        for seq in over:
            self.runner.block_table.release(seq.seq_id)

    def mark_scheduled(self, output: SchedulerOutput) -> None:
        """Notes when each request of a step was first scheduled."""
        now = time.time()
        for item in output.scheduled:
            state = self.requests[item.seq.request_id]
            if state.first_scheduled_time is None:
                state.first_scheduled_time = now

    def _run_step(
        self, output: SchedulerOutput, unreadable: dict[str, EngineError] | None = None
    ) -> list[StreamEvent]:
        """Runs a scheduled step and turns its sampled tokens into events."""
        self.mark_scheduled(output)
        if unreadable is None:
            unreadable = self.lora.prepare_step()
        if unreadable:
            output = self._fail_unreadable_adapters(output, unreadable)
            if output.is_empty:
                return []
        scrub = self.kv.take_blocks_to_scrub()
        if scrub:
            self.runner.scrub_blocks(scrub)
        sampled, faults = execute_isolated(self.runner.execute, self.runner.rewind, output)
        for request_id, exc in faults.items():
            self._fail(request_id, exc)
        return self.emit(output, sampled)

    def emit(
        self, output: SchedulerOutput, sampled: dict[str, SampledToken], *, settle: bool = False
    ) -> list[StreamEvent]:
        """Hands a run step's tokens to their sequences and requests; returns the events.

        `settle`: the step was launched ahead (engine.overlap), its rows advanced then.
        """
        now = time.time()
        touched: dict[str, RequestState] = {}
        for item in output.scheduled:
            seq = item.seq
            token = sampled.get(seq.seq_id)
            try:
                if token is not None and token.constraint_ended is not None:
                    touched[seq.request_id] = self._end_constrained(item, token, now)
                elif item.spec and token is not None:
                    self._take_verified(item, token, now, touched)
                else:
                    self._take_token(item, token, now, touched, settle=settle)
            except Exception as exc:
                self._fail(seq.request_id, exc)
        events: list[StreamEvent] = []
        for request_id, state in touched.items():
            if request_id not in self.requests:  # failed after its token was taken
                continue
            try:
                event = self._finalize(state, now) if state.finished else state.take_event(now)
            except Exception as exc:
                self._fail(request_id, exc)
                continue
            if event is not None:
                events.append(event)
        return events

    def _take_token(
        self,
        item: ScheduledSequence,
        token: SampledToken | None,
        now: float,
        touched: dict[str, RequestState],
        *,
        settle: bool = False,
    ) -> None:
        """Advances one scheduled row and hands its sampled token, if any, to its request
        (`settle`: the row was advanced when its step was launched ahead)."""
        seq = item.seq
        token_id = None if token is None else token.token_id
        update = self.scheduler.settle_one if settle else self.scheduler.update_one
        if not update(item, token_id):
            return
        assert token is not None
        state = self.requests[seq.request_id]
        touched[seq.request_id] = state
        self._num_generated += 1
        if state.first_token_time is None:  # its prompt is done: counted once
            self._num_prompt += len(state.prompt_token_ids)
        stop = state.add_token(seq, token, now)
        if stop is not None and not seq.is_finished:
            self.scheduler.finish(seq, "stop", stop)
        elif token.grammar_complete and not seq.is_finished:
            self.scheduler.finish(seq, "stop")

    def _take_verified(
        self,
        item: ScheduledSequence,
        token: SampledToken,
        now: float,
        touched: dict[str, RequestState],
    ) -> None:
        """A verify row's tokens, taken one at a time as if each were its own decode step
        (so stops, stop strings and lengths apply after every token, and the prefix
        cache registers a block only once it is full of accepted tokens); then the
        blocks held for rejected drafts are given back."""
        seq = item.seq
        assert self.speculator is not None
        self.speculator.observe_verify(seq.seq_id, len(item.spec), len(token.accepted))
        seq.spec_extra_draws += token.extra_draws
        for j, token_id in enumerate((*token.accepted, token.token_id)):
            if seq.is_finished:
                break
            single = ScheduledSequence(seq, item.start + j, 1)
            self._take_token(single, SampledToken(token_id), now, touched)
        if not seq.is_finished:
            self.kv.trim(seq)

    def _end_constrained(
        self, item: ScheduledSequence, token: SampledToken, now: float
    ) -> RequestState:
        """Ends a sequence whose output constraint can go no further (a dead end, a parser
        limit, its mask budget) as if it ran out of tokens ("length"): what it delivered
        stands and is billed, this step's token is dropped, the other rows go on."""
        seq = item.seq
        state = self.requests[seq.request_id]
        self.scheduler.update_one(item, None)  # its KV up to here counts; no token taken
        if state.first_token_time is None:  # the prompt was processed: it is billed
            state.first_token_time = now
            self._num_prompt += len(state.prompt_token_ids)
        self.scheduler.finish(seq, "length")
        log.warning("request %s ended: %s", seq.request_id, token.constraint_ended)
        return state

    def _fail_unreadable_adapters(
        self, output: SchedulerOutput, unreadable: dict[str, EngineError]
    ) -> SchedulerOutput:
        """Fails the requests of adapters whose weights could not be read back; the
        step goes on without them, and their slots are free again."""
        for request_id, state in list(self.requests.items()):
            for seq in state.seqs:
                if seq.adapter in unreadable and seq.adapter_digest is not None:
                    self._fail(request_id, unreadable[seq.adapter])
                    break
        for name in unreadable:
            self.lora.slots.drop(name)
        kept = tuple(item for item in output.scheduled if not item.seq.is_finished)
        return dataclasses.replace(output, scheduled=kept)

    def take_failures(self) -> list[tuple[str, Exception]]:
        """The requests failed since the last call, each with its cause (for the log only)."""
        failures, self._failures = self._failures, []
        return failures

    def _fail(self, request_id: str, exc: Exception) -> None:
        """Drops one request that made the engine raise; the cause stays in the log."""
        if request_id not in self.requests:
            return
        log.error("request %s failed in the engine", request_id, exc_info=exc)
        self._failures.append((request_id, exc))
        self.fail_requests([request_id])

    def _finalize(self, state: RequestState, now: float) -> StreamEvent | None:
        event = state.take_event(now)
        del self.requests[state.request_id]
        self._num_finished += 1
        for seq in state.seqs:
            self._release(seq.seq_id)
        if self.keep_finished:
            self.finished[state.request_id] = state
        return event

    def stats(self, *, domains: bool = True) -> EngineStats:
        """Counters and gauges for metrics.

        `domains=False` leaves `prefix_cache_domains` empty: a snapshot of every cache
        domain ever seen costs O(domains), too much for a report on every step.
        """
        lora_running, lora_waiting = self.lora.counts(
            self.scheduler.running, self.scheduler.waiting
        )
        budget = self.scheduler.step_budget
        overlap = None if self.overlap is None else self.overlap.counters
        return EngineStats(
            max_loras=self.config.lora.max_loras,
            lora_running=lora_running,
            lora_waiting=lora_waiting,
            lora_device=tuple(sorted(self.lora.slots.resident)),
            lora_host=self.lora.registry.host_resident(),
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            num_batch_running=sum(s.batch for s in self.scheduler.running),
            num_batch_waiting=sum(s.batch for s in self.scheduler.waiting),
            kv_cache_usage=self.kv.usage,
            prefix_cache_queries=self.kv.query_tokens,
            prefix_cache_hits=self.kv.hit_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_blocks=self.capacity.num_blocks,
            block_size=self.capacity.block_size,
            num_requests_finished=self._num_finished,
            num_generated_tokens=self._num_generated,
            num_prompt_tokens=self._num_prompt,
            prefix_cache_domains=self.kv.domain_stats() if domains else {},
            prefill_token_cap=budget.prefill_cap() if budget.enabled else None,
            kv_events_dropped=None if self.kv_events is None else self.kv_events.dropped,
            tenant_kv=self.scheduler.kv_shares.stats(self.scheduler.running),
            kv_tiers=() if self.kv.tier is None else self.kv.tier.tier_stats(),
            spec_decode=None if self.speculator is None else self.speculator.stats(),
            num_overlapped_steps=overlap.overlapped_steps if overlap else 0,
            num_synchronous_steps=overlap.synchronous_steps if overlap else 0,
        )
