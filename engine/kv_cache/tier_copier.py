"""Running the KV tiers' copies: write-backs in the step, loads off its path (issue 41).

`TierCopier.run` takes the ops a step's scheduling queued (`HostTier.take_ops`) and
runs them in their order, except the loads (host slot -> device block) and fetches (a
verified disk payload -> device block): those go to a worker, a thread on the CPU
(host-to-host copies, during which torch releases the GIL) or a side CUDA stream with
an event per batch on a GPU, while the step's forward pass runs. The order still holds
where it matters: a write-back or scrub into a slot that a load still reads waits for
that load first. (A load's device block is held by it, so nothing else touches it.)

`join`, at the start of each step, collects the finished loads and tells the manager:
their blocks are ready, or, for a load that failed, dropped with the sequences over
them sent back to be recomputed (never a forward pass over bytes that did not arrive).
It also adds each transfer's seconds to its tier's `load_time_s` / `store_time_s`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

import torch

from engine.kv_cache.host_buffer import HostKVBuffer
from engine.kv_cache.host_tier import HostTier, TierOp
from engine.kv_cache.manager import KVCacheManager
from engine.kv_cache.tier_cost import LoadCostRule

log = logging.getLogger("engine")

# Ops the worker runs: they write device blocks the manager holds for them.
ASYNC_KINDS = ("load", "fetch")
# Ops that write a host slot (a load may still be reading it).
SLOT_WRITES = ("save", "zero")

# Runs a batch of load ops; returns the seconds spent per op kind.
Copy = Callable[[list[TierOp]], dict[str, float]]


class LoadBatch:
    """One step's loads, running on the worker thread or on the side stream."""

    def __init__(self, ops: list[TierOp]) -> None:
        self.ops = ops
        self.blocks = [op.block for op in ops]
        self.slots = {op.slot for op in ops if op.slot >= 0}
        self.future: Future[dict[str, float]] | None = None
        # CUDA: events around the copies, and an error raised while queueing them.
        self.start: torch.cuda.Event | None = None
        self.end: torch.cuda.Event | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        """Whether the copies are over (successfully or not)."""
        if self.future is not None:
            return self.future.done()
        return self.end is None or bool(self.end.query())  # type: ignore[no-untyped-call]

    def wait(self) -> None:
        """Blocks until the copies are over."""
        if self.future is not None:
            wait_futures([self.future])
        elif self.end is not None:
            self.end.synchronize()

    def outcome(self) -> tuple[dict[str, float], BaseException | None]:
        """(seconds per op kind, the error if the load failed); after `wait`."""
        if self.future is not None:
            exc = self.future.exception()
            return ({}, exc) if exc is not None else (self.future.result(), None)
        if self.error is not None or self.start is None or self.end is None:
            return {}, self.error
        seconds = self.start.elapsed_time(self.end) / 1000.0
        # One span for the whole batch, shared by kind in proportion to the ops.
        kinds: dict[str, float] = {}
        for op in self.ops:
            kinds[op.kind] = kinds.get(op.kind, 0.0) + seconds / len(self.ops)
        return kinds, None


class TierCopier:
    """Executes a host tier's ops for the engine, its loads asynchronously."""

    def __init__(
        self,
        buffer: HostKVBuffer,
        tier: HostTier,
        kv: KVCacheManager,
        cost: LoadCostRule | None,
        *,
        copy: Copy | None = None,
    ) -> None:
        self.buffer = buffer
        self.tier = tier
        self.kv = kv
        self.cost = cost
        # Replaceable (tests gate or break it); it runs on the worker, never the step.
        self.copy: Copy = copy if copy is not None else buffer.execute
        self._batches: list[LoadBatch] = []
        self._stream: torch.cuda.Stream | None = None
        self._pool: ThreadPoolExecutor | None = None
        if buffer.pinned and torch.cuda.is_available():
            self._stream = torch.cuda.Stream(buffer.device)  # type: ignore[no-untyped-call]
        else:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kv-tier-loads")
        self._warned = False
        kv.track_loads()

    @property
    def busy(self) -> bool:
        """Whether loads are in flight (or finished and not joined yet)."""
        return bool(self._batches)

    # -- the step's ops --------------------------------------------------------------

    def run(self, ops: list[TierOp]) -> None:
        """Runs `ops` in order: the others now, the loads on the worker."""
        sync: list[TierOp] = []
        loads: list[TierOp] = []
        for op in ops:
            if op.kind in ASYNC_KINDS:
                loads.append(op)
                continue
            if op.kind in SLOT_WRITES and self._reads_slot(op.slot, loads):
                # The earlier ops first, then the loads that read the slot, then this.
                self._run_sync(sync)
                sync = []
                if any(op.slot == load.slot for load in loads):
                    self._submit(loads)
                    loads = []
                for batch in self._batches:
                    if op.slot in batch.slots:
                        batch.wait()
            sync.append(op)
        self._run_sync(sync)
        self._submit(loads)

    def _reads_slot(self, slot: int, pending: list[TierOp]) -> bool:
        return any(op.slot == slot for op in pending) or any(slot in b.slots for b in self._batches)

    def _run_sync(self, ops: list[TierOp]) -> None:
        if ops:
            self._account(self.buffer.execute(ops, self.cost))

    def _submit(self, ops: list[TierOp]) -> None:
        if not ops:
            return
        batch = LoadBatch(ops)
        if self._pool is not None:
            batch.future = self._pool.submit(self.copy, ops)
        else:
            self._submit_cuda(batch)
        self._batches.append(batch)

    def _submit_cuda(self, batch: LoadBatch) -> None:
        """Queues the copies on the side stream, after what the step's stream has queued
        (a block freed by an earlier step may still be written there)."""
        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self.buffer.device))
        batch.start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        batch.end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(self._stream):
            batch.start.record(self._stream)
            try:
                self.copy(batch.ops)
            except Exception as exc:  # any failure is a miss for the sequences over it
                batch.error = exc
            batch.end.record(self._stream)

    # -- joining ----------------------------------------------------------------------

    def join(self, requeue: Callable[[set[int]], None]) -> None:
        """Ends the finished loads (all of them, waiting, once one failed), telling the
        manager; `requeue` preempts the sequences holding blocks of a failed load."""
        finished = [b for b in self._batches if b.done()]
        if not finished:
            return
        outcomes = [(b, *b.outcome()) for b in finished]
        if any(exc is not None for _b, _t, exc in outcomes):
            # The manager drops a failed chain whole: no copy may still write into it.
            self.drain()
            finished = list(self._batches)
            outcomes = [(b, *b.outcome()) for b in finished]
        done: list[int] = []
        failed: list[int] = []
        for batch, times, exc in outcomes:
            self._batches.remove(batch)
            if exc is None:
                done.extend(batch.blocks)
                self._account(times)
                moved = sum(op.kind == "load" for op in batch.ops) * self.buffer.bytes_per_block
                if self.cost is not None and moved and times.get("load", 0.0) > 0:
                    self.cost.observe_copy(moved, times["load"])
            else:
                failed.extend(batch.blocks)
                level = logging.DEBUG if self._warned else logging.WARNING
                log.log(level, "KV tier load failed (%s): its blocks are recomputed", exc)
                self._warned = True
        self.kv.finish_loads(done, failed, requeue)

    def drain(self) -> None:
        """Waits until every load in flight is over (not joined)."""
        for batch in self._batches:
            batch.wait()

    def wait_any(self, timeout_s: float) -> None:
        """Waits (at most `timeout_s`) for one load in flight to end; at once if none."""
        futures = [b.future for b in self._batches if b.future is not None]
        if futures:
            wait_futures(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)
        elif self._batches:
            self._batches[0].wait()

    def close(self, requeue: Callable[[set[int]], None]) -> None:
        """Engine shutdown: lets the loads end, joins them, stops the worker."""
        self.drain()
        self.join(requeue)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _account(self, times: dict[str, float]) -> None:
        """Adds transfer seconds to the tier each op kind belongs to."""
        host = self.tier.counters
        host.store_time_s += times.get("save", 0.0)
        host.load_time_s += times.get("load", 0.0)
        lower = self.tier.lower
        if lower is not None:
            lower.counters.store_time_s += times.get("spill", 0.0)
            lower.counters.load_time_s += times.get("fetch", 0.0)
