"""Tenant fairness by virtual token counters (Sheng et al., OSDI 2024, "Fairness in
Serving Large Language Models").

Each fairness key (the tenant; a sequence's cache domain when no tenant is given)
has a counter of weighted service: prompt tokens at admission plus 2 x output
tokens as they are generated, divided by the key's weight. The backlogged key (one
with waiting sequences) with the lowest counter is admitted first. A key that
returns from idle is lifted to the lowest counter among the backlogged ones, so
idling banks no credit. With two backlogged keys the gap between their counters
stays bounded (the paper's Theorem 4.4), whereas FCFS lets it grow with time.

Within one key's own queue the order is FCFS, or, given the KV cache manager,
longest prefix match (`fair_lpm`): the key's sequence with the most cached tokens
goes first. A request's priority (lower first) comes before both, among the key's
first `MAX_CANDIDATES` waiting sequences; it only picks among one key's sequences,
never which key goes next. The choice of key never looks at the cache, and the
counters charge whole prompts whatever was cached, so the order across tenants
cannot depend on what another tenant has cached (the PromptPeek channel, NDSS 2025).

A key with nothing waiting or running is forgotten (`forget`), so the maps hold
only the keys with work in the engine.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator, Set

from engine.kv_cache.manager import KVCacheManager
from engine.scheduler.tenants import TenantBook
from engine.sequence import Sequence

# Bounds the prefix lookups one `peek` makes within a key; deeper its order stays FCFS.
MAX_CANDIDATES = 32


class FairQueue:
    """`WaitingQueue` ordering keys by virtual token counter; FCFS or LPM within a key."""

    def __init__(
        self,
        weights: dict[str, float] | None = None,
        *,
        book: TenantBook | None = None,
        kv: KVCacheManager | None = None,
    ) -> None:
        self._queues: dict[str, deque[tuple[int, Sequence]]] = {}
        self.counters: dict[str, float] = {}
        # The scheduler's book holds the weights; a queue used alone keeps its own.
        self.book = book if book is not None else TenantBook(weights)
        self.kv = kv  # given: longest prefix match within a key
        self._order = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for q in self._queues.values():
            for _, seq in q:
                yield seq

    def weight(self, key: str) -> float:
        """A key's share (1 unless set)."""
        return self.book.weight(key)

    def set_weight(self, key: str, weight: float) -> None:
        """Sets a key's share; service is divided by it."""
        self.book.set_weight(key, weight)

    def served(self, key: str) -> float | None:
        """The key's virtual token counter (0 for a key without one yet)."""
        return self.counters.get(key, 0.0)

    def forget(self, key: str) -> None:
        """Drops an idle key's counter and queue (it has nothing waiting or running)."""
        self.counters.pop(key, None)
        if not self._queues.get(key):
            self._queues.pop(key, None)

    def _backlogged(self) -> list[str]:
        return [d for d, q in self._queues.items() if q]

    def push(self, seq: Sequence) -> None:
        """Queues a new arrival; a domain returning from idle is lifted (no banked credit)."""
        d = seq.fairness_key
        if not self._queues.get(d):
            active = [self.counters[e] for e in self._backlogged() if e != d]
            if active:
                self.counters[d] = max(self.counters.get(d, 0.0), min(active))
            else:
                self.counters.setdefault(d, 0.0)
        self._queues.setdefault(d, deque()).append((next(self._order), seq))
        self._len += 1

    def push_front(self, seq: Sequence) -> None:
        """Returns a preempted sequence to the front of its domain (no lift: not an arrival)."""
        self.counters.setdefault(seq.fairness_key, 0.0)
        self._queues.setdefault(seq.fairness_key, deque()).appendleft((-1, seq))
        self._len += 1

    def peek(self, skip: Set[str] = frozenset()) -> Sequence | None:
        """The next sequence of the backlogged key with the lowest counter (ties: oldest head).

        Sequences in `skip` are passed over; a key with nothing else waiting is too."""
        best: tuple[float, int, str] | None = None
        for d in self._backlogged():
            head = next(self._open(self._queues[d], skip), None)
            if head is None:
                continue
            key = (self.counters[d], head[0], d)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is None:
            return None
        return self._within(self._open(self._queues[best[2]], skip))

    @staticmethod
    def _open(queue: deque[tuple[int, Sequence]], skip: Set[str]) -> Iterator[tuple[int, Sequence]]:
        """A key's queue without the sequences held back this step."""
        return iter(queue) if not skip else (e for e in queue if e[1].seq_id not in skip)

    def _within(self, queue: Iterable[tuple[int, Sequence]]) -> Sequence:
        """Among the key's first candidates: the lowest priority, then (`fair_lpm`) the
        longest cached prefix, then the oldest. With equal priorities that is the FCFS
        head, or the longest match."""
        chosen: Sequence | None = None
        best: tuple[int, int] | None = None
        for _, seq in itertools.islice(queue, MAX_CANDIDATES):
            n = self.kv.match_length(seq) if self.kv is not None and seq.use_cache else 0
            rank = (seq.priority, -n)
            if best is None or rank < best:
                chosen, best = seq, rank
        assert chosen is not None  # called only for a key with an open sequence
        return chosen

    def pop(self, seq: Sequence) -> None:
        """Removes the admitted sequence."""
        if not self.remove(seq):
            raise ValueError(f"sequence {seq.seq_id} is not queued")

    def remove(self, seq: Sequence) -> bool:
        """Removes `seq` if present."""
        q = self._queues.get(seq.fairness_key)
        if not q:
            return False
        for i, (_, s) in enumerate(q):
            if s is seq:
                del q[i]
                self._len -= 1
                if not q:
                    del self._queues[seq.fairness_key]
                return True
        return False

    def charge(self, seq: Sequence, tokens: int) -> None:
        """Adds weighted service to the sequence's key."""
        d = seq.fairness_key
        self.counters[d] = self.counters.get(d, 0.0) + tokens / self.weight(d)
