"""Longest-prefix-match admission, compared only within one cache domain.

Across domains the order stays first come, first served (the oldest waiting
sequence picks the domain), so where a request stands in the queue never depends
on what another domain has cached. Within that domain the sequence with the most
cached tokens goes first, ties by arrival.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from engine.kv_cache.manager import KVCacheManager
from engine.sequence import Sequence

# Bounds the lookups one `peek` makes; deeper in the queue order stays FCFS.
MAX_CANDIDATES = 32


class LpmQueue:
    """`WaitingQueue` that prefers the longest cached prefix within the head's domain."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._q: deque[Sequence] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)

    def push(self, seq: Sequence) -> None:
        """Appends at the back."""
        self._q.append(seq)

    def push_front(self, seq: Sequence) -> None:
        """Puts a preempted sequence back at the front."""
        self._q.appendleft(seq)

    def peek(self) -> Sequence | None:
        """Among the head domain's first waiting sequences, the one with the longest match."""
        if not self._q:
            return None
        domain = self._q[0].cache_domain
        best: Sequence | None = None
        best_len = -1
        seen = 0
        for seq in self._q:
            if seq.cache_domain != domain:
                continue
            n = self.kv.match_length(seq)
            if n > best_len:
                best, best_len = seq, n
            seen += 1
            if seen >= MAX_CANDIDATES:
                break
        return best

    def pop(self, seq: Sequence) -> None:
        """Removes the admitted sequence."""
        self._q.remove(seq)

    def remove(self, seq: Sequence) -> bool:
        """Removes `seq` if present."""
        try:
            self._q.remove(seq)
        except ValueError:
            return False
        return True

    def charge(self, seq: Sequence, tokens: int) -> None:
        """LPM keeps no service accounts."""

    def set_weight(self, domain: str, weight: float) -> None:
        """LPM ignores weights."""
