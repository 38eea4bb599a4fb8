"""Prompt blocks being computed right now, so a second request does not compute them too.

When several requests of one cache domain arrive together with a shared prefix (a
system prompt, a few-shot block), the first one admitted computes the prefix and the
others would compute it again, because a block enters the prefix cache only once it
is full and computed. Here the first one claims the blocks it is about to compute,
by a digest of the chain of tokens up to each block; a later request whose next
uncached block is claimed by a running sequence of *its own* domain waits in the
queue until that block is computed, then adopts it from the cache as any hit.

Only the same cache domain is ever waited on: waiting for another tenant's work
would let a tenant time whether someone else is sending the same prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv_cache.block_meta import SeqCacheState
from engine.sequence import Sequence, SequenceStatus

FlightKey = tuple[bytes, int]  # (chain root, digest of the tokens through a block)


def flight_keys(st: SeqCacheState, n: int) -> list[FlightKey]:
    """The state's first `n` blocks' flight keys (extending `st.flight` once each);
    its chunks must already be cut that far."""
    while len(st.flight) < n:
        i = len(st.flight)
        seg = next(s for s in st.segments if s.end is None or i < s.end)
        parent = st.flight[i - 1][1] if i > seg.start else 0
        st.flight.append((seg.root, hash((parent, st.chunks[i]))))
    return st.flight[:n]


@dataclass
class InFlightPrefixes:
    """Which running sequence is computing each claimed prompt block."""

    block_size: int
    _owner: dict[FlightKey, Sequence] = field(default_factory=dict)
    _claims: dict[str, list[FlightKey]] = field(default_factory=dict)

    def claim(self, seq: Sequence, keys: list[FlightKey], first: int) -> None:
        """`seq` will compute its blocks `first..len(keys)`: claims the unclaimed ones."""
        mine = self._claims.setdefault(seq.seq_id, [])
        for key in keys[first:]:
            if self._owner.setdefault(key, seq) is seq:
                mine.append(key)

    def release(self, seq_id: str) -> None:
        """Drops the claims of a sequence that stopped running (finished or preempted)."""
        for key in self._claims.pop(seq_id, ()):
            owner = self._owner.get(key)
            if owner is not None and owner.seq_id == seq_id:
                del self._owner[key]

    def computing(self, seq: Sequence, keys: list[FlightKey], block: int) -> bool:
        """Whether another running sequence of `seq`'s domain is computing its `block`
        now (claimed, and not yet past it: a step still in flight has not written it)."""
        if block >= len(keys):
            return False
        owner = self._owner.get(keys[block])
        return (
            owner is not None
            and owner is not seq
            and owner.cache_domain == seq.cache_domain
            and owner.status == SequenceStatus.RUNNING
            and owner.num_computed_tokens - owner.num_unsettled_tokens
            < (block + 1) * self.block_size
        )
