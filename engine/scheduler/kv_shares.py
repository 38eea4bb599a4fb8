"""Each tenant's weighted share of the KV pool in the running set, and its hard quota.

The waiting queue is fair across tenants (virtual token counters, waiting slots), but
the blocks of running sequences were not: a tenant that admitted many long generations
held the pool, and the newest sequence, whoever owned it, was preempted when the pool
ran short ("Fill and Squeeze"). Here, among the fairness keys with work in the engine
(waiting or running), each key is entitled to

    share(key) = usable blocks * weight(key) / sum of the weights of those keys

and under contention:
- the preemption victim is the newest running sequence of the key most over its share
  (blocks held by its running sequences minus its share), so an attacker's load falls
  on the attacker;
- a key whose admission would take it over its share is passed over while another key
  under its share has sequences waiting.
A key alone on the engine is entitled to the whole pool: shares bind only when several
keys have work.

A key's quota (`DomainRule.kv_quota_blocks` on the key's root, pushed with the cache
rules) is a hard cap whatever the contention: a sequence that would take its key over
it preempts the key's own newest sequence (itself, when it is the newest), and a
waiting one is passed over until the key's blocks are freed, holding no other key.

The counters of preemptions suffered and caused are kept for the most recent
`MAX_KEYS` keys, so that a stream of one-off tenants stays bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from engine.kv_cache.manager import KVCacheManager
from engine.scheduler.tenants import TenantBook
from engine.sequence import Sequence
from engine.stats import TenantKVStats

MAX_KEYS = 1024  # keys whose preemption counters are kept once they go idle


@dataclass
class _Counts:
    suffered: int = 0
    caused: int = 0


def blocks_held(running: Iterable[Sequence]) -> dict[str, int]:
    """Blocks held by the running sequences of each fairness key."""
    used: dict[str, int] = {}
    for seq in running:
        if seq.block_ids:
            used[seq.fairness_key] = used.get(seq.fairness_key, 0) + seq.num_held_blocks
    return used


class KVShares:
    """Weighted KV shares and quotas of the fairness keys; picks preemption victims."""

    def __init__(self, book: TenantBook, kv: KVCacheManager, *, enabled: bool = True) -> None:
        self.book = book
        self.kv = kv
        self.enabled = enabled  # False: newest-first preemption, no share gate (quotas hold)
        self._counts: OrderedDict[str, _Counts] = OrderedDict()

    # -- shares -------------------------------------------------------------------------

    def shares(self) -> dict[str, float]:
        """Each live key's share of the usable blocks (the pool less pinned blocks)."""
        keys = list(self.book.keys)
        if not keys:
            return {}
        usable = max(0, self.kv.num_blocks - self.kv.num_pinned)
        weights = {k: self.book.weight(k) for k in keys}
        total = sum(weights.values())
        return {k: usable * w / total for k, w in weights.items()}

    def quota(self, key: str) -> int | None:
        """The key's hard cap on blocks held by its running sequences (None: none)."""
        return self.kv.kv_quota(key)

    # -- preemption ---------------------------------------------------------------------

    def victim(self, running: list[Sequence], requester: Sequence) -> Sequence:
        """The running sequence to preempt so that `requester` can grow.

        Disabled: the newest running sequence. Enabled: the newest of the key most over
        its share (ties: the key whose newest sequence is newer).
        """
        if not self.enabled or len(running) == 1:
            return running[-1]
        used = blocks_held(running)
        shares = self.shares()
        newest: dict[str, int] = {}
        for i, seq in enumerate(running):
            newest[seq.fairness_key] = i
        key = max(
            newest,
            key=lambda k: (used.get(k, 0) - shares.get(k, 0.0), newest[k]),
        )
        return running[newest[key]]

    def own_victim(self, running: list[Sequence], key: str) -> Sequence | None:
        """The newest running sequence of `key` (for its quota), or None."""
        for seq in reversed(running):
            if seq.fairness_key == key:
                return seq
        return None

    def over_quota(self, seq: Sequence, total_blocks: int, used: int) -> bool:
        """Whether `seq`, holding `total_blocks` blocks, takes its key over its quota;
        `used` is what the key's running sequences hold now (`seq`'s own included)."""
        quota = self.quota(seq.fairness_key)
        if quota is None:
            return False
        return used - seq.num_held_blocks + total_blocks > quota

    def preempted(self, victim: Sequence, requester: Sequence) -> None:
        """Counts one preemption of `victim` made for `requester`."""
        self._count(victim.fairness_key).suffered += 1
        if requester.fairness_key != victim.fairness_key:
            self._count(requester.fairness_key).caused += 1

    def _count(self, key: str) -> _Counts:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = _Counts()
            if len(self._counts) > MAX_KEYS:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(key)
        return counts

    # -- admission ----------------------------------------------------------------------

    def admission_gate(self, running: Iterable[Sequence]) -> AdmissionGate:
        """A gate for one step's admissions, over the blocks held now."""
        return AdmissionGate(self, blocks_held(running), self.shares())

    # -- stats --------------------------------------------------------------------------

    def stats(self, running: Iterable[Sequence]) -> dict[str, TenantKVStats]:
        """Blocks in use and preemption counts per key (live keys and counted ones)."""
        used = blocks_held(running)
        out: dict[str, TenantKVStats] = {}
        for key in (*self.book.keys, *self._counts):
            if key in out:
                continue
            counts = self._counts.get(key) or _Counts()
            out[key] = TenantKVStats(used.get(key, 0), counts.suffered, counts.caused)
        return out


class AdmissionGate:
    """Whether a waiting sequence may be admitted now, for one step's admission loop."""

    def __init__(self, shares: KVShares, used: dict[str, int], share: dict[str, float]) -> None:
        self._kv = shares
        self.used = used
        self._share = share

    def allows(self, seq: Sequence, total_blocks: int, waiting: Iterable[str]) -> bool:
        """Whether `seq` may start holding `total_blocks` blocks; `waiting` are the keys
        with sequences waiting that have not been passed over this step."""
        key = seq.fairness_key
        after = self.used.get(key, 0) + total_blocks
        quota = self._kv.quota(key)
        if quota is not None and after > quota:
            return False
        if not self._kv.enabled or after <= self._share.get(key, 0.0):
            return True
        # Over its share: only while no key under its share waits for room.
        for other in waiting:
            if other != key and self.used.get(other, 0) < self._share.get(other, 0.0):
                return False
        return True

    def within_share(self, seq: Sequence, total_blocks: int) -> bool:
        """Whether `seq` holding `total_blocks` blocks keeps its key within its share (then
        no other key's need preempts it while another key is over its share)."""
        key = seq.fairness_key
        return self.used.get(key, 0) + total_blocks <= self._share.get(key, 0.0)

    def admitted(self, seq: Sequence, total_blocks: int) -> None:
        """`seq` now holds `total_blocks` blocks."""
        key = seq.fairness_key
        self.used[key] = self.used.get(key, 0) + total_blocks
