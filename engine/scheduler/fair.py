"""Tenant fairness by virtual token counters (Sheng et al., OSDI 2024, "Fairness in
Serving Large Language Models").

Each cache domain has a counter of weighted service: prompt tokens at admission
plus 2 x output tokens as they are generated, divided by the domain's weight.
The backlogged domain (one with waiting sequences) with the lowest counter is
admitted first. A domain that returns from idle is lifted to the lowest counter
among the backlogged ones, so idling banks no credit. With two backlogged domains
the gap between their counters stays bounded (the paper's Theorem 4.4), whereas
FCFS lets it grow with time.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator

from engine.sequence import Sequence


class FairQueue:
    """`WaitingQueue` ordering domains by virtual token counter, FCFS within a domain."""

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self._queues: dict[str, deque[tuple[int, Sequence]]] = {}
        self.counters: dict[str, float] = {}
        self._weights: dict[str, float] = dict(weights or {})
        self._order = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sequence]:
        for q in self._queues.values():
            for _, seq in q:
                yield seq

    def weight(self, domain: str) -> float:
        """A domain's share (1 unless set)."""
        return self._weights.get(domain, 1.0)

    def set_weight(self, domain: str, weight: float) -> None:
        """Sets a domain's share; service is divided by it."""
        if not weight > 0:
            raise ValueError(f"a domain weight must be positive, got {weight}")
        self._weights[domain] = float(weight)

    def _backlogged(self) -> list[str]:
        return [d for d, q in self._queues.items() if q]

    def push(self, seq: Sequence) -> None:
        """Queues a new arrival; a domain returning from idle is lifted (no banked credit)."""
        d = seq.cache_domain
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
        self.counters.setdefault(seq.cache_domain, 0.0)
        self._queues.setdefault(seq.cache_domain, deque()).appendleft((-1, seq))
        self._len += 1

    def peek(self) -> Sequence | None:
        """Head of the backlogged domain with the lowest counter (ties: oldest head)."""
        best: tuple[float, int, Sequence] | None = None
        for d in self._backlogged():
            order, seq = self._queues[d][0]
            key = (self.counters[d], order, seq)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else best[2]

    def pop(self, seq: Sequence) -> None:
        """Removes the admitted sequence."""
        if not self.remove(seq):
            raise ValueError(f"sequence {seq.seq_id} is not queued")

    def remove(self, seq: Sequence) -> bool:
        """Removes `seq` if present."""
        q = self._queues.get(seq.cache_domain)
        if not q:
            return False
        for i, (_, s) in enumerate(q):
            if s is seq:
                del q[i]
                self._len -= 1
                return True
        return False

    def charge(self, seq: Sequence, tokens: int) -> None:
        """Adds weighted service to the sequence's domain."""
        d = seq.cache_domain
        self.counters[d] = self.counters.get(d, 0.0) + tokens / self.weight(d)
