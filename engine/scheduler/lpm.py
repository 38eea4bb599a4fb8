"""Longest-prefix-match admission, compared only within one cache domain.

Across domains the order stays first come, first served (the oldest waiting
sequence picks the domain), so where a request stands in the queue never depends
on what another domain has cached. Within that domain the sequence with the most
cached tokens goes first, ties by arrival.
"""

from __future__ import annotations

from collections.abc import Set

from engine.kv_cache.manager import KVCacheManager
from engine.scheduler.queue import FcfsQueue
from engine.sequence import Sequence

# Bounds the lookups one `peek` makes; deeper in the queue order stays FCFS.
MAX_CANDIDATES = 32


class LpmQueue(FcfsQueue):
    """`WaitingQueue` that prefers the longest cached prefix within the head's domain.

    Arrival order, preemption and removal are FCFS's; only the choice of `peek` differs.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        super().__init__()
        self.kv = kv

    def peek(self, skip: Set[str] = frozenset()) -> Sequence | None:
        """Among the head domain's first waiting sequences (those not in `skip`), the one
        with the longest match."""
        head = next((seq for seq in self._q if seq.seq_id not in skip), None)
        if head is None:
            return None
        domain = head.cache_domain
        best: Sequence | None = None
        best_len = -1
        seen = 0
        for seq in self._q:
            if seq.cache_domain != domain or seq.seq_id in skip:
                continue
            n = self.kv.match_length(seq)
            if n > best_len:
                best, best_len = seq, n
            seen += 1
            if seen >= MAX_CANDIDATES:
                break
        return best
