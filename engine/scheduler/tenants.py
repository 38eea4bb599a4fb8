"""Per fairness key (the tenant): its weight, its live sequences and its share of the
waiting slots.

The waiting queue is shared, so without shares one tenant's burst fills it and every
other tenant is refused. Here each key with sequences waiting is entitled to
`capacity * weight / total weight` of the slots. A key may borrow slots nobody uses;
when the queue is full and a key under its share arrives, the newest never-admitted
sequences of the key most over its share make room (they are refused instead).

Every entry is dropped as soon as its key has nothing waiting or running, so the
maps stay as small as the set of tenants with work in the engine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

from engine.sequence import Sequence


def within_share(count: int, n: int, weight: float, total_weight: float, capacity: int) -> bool:
    """Whether a key holding `count` slots may take `n` more under its weighted share.

    `total_weight` is the weight of every key holding slots, this one included.
    """
    return (count + n) * total_weight <= capacity * weight


class TenantBook:
    """Weights, live and waiting sequence counts per fairness key; idle keys are pruned."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        self._static: dict[str, float] = {k: check_weight(w) for k, w in (weights or {}).items()}
        self._weights: dict[str, float] = {}  # per request's tenant; pruned with the key
        self._live: dict[str, int] = {}  # waiting + running sequences
        self.waiting: dict[str, int] = {}  # waiting sequences (preempted ones included)
        # Waiting sequences never admitted, oldest first: the ones that may make room.
        self._fresh: dict[str, OrderedDict[str, Sequence]] = {}

    def weight(self, key: str) -> float:
        """The key's share (the configured one, else the last one given, else 1)."""
        return self._weights.get(key) or self._static.get(key, 1.0)

    def set_weight(self, key: str, weight: float) -> None:
        """Sets the key's share while it has work; forgotten when it goes idle."""
        self._weights[key] = check_weight(weight)

    @property
    def keys(self) -> Iterable[str]:
        """Keys with sequences waiting or running."""
        return self._live.keys()

    def has_fresh(self, key: str) -> bool:
        """Whether `key` has waiting sequences that were never admitted."""
        return bool(self._fresh.get(key))

    def arrived(self, seq: Sequence) -> None:
        """A new sequence was queued."""
        key = seq.fairness_key
        self._live[key] = self._live.get(key, 0) + 1
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self._fresh.setdefault(key, OrderedDict())[seq.seq_id] = seq

    def admitted(self, seq: Sequence) -> None:
        """A waiting sequence started running."""
        key = seq.fairness_key
        self._leave_waiting(key)
        fresh = self._fresh.get(key)
        if fresh is not None and fresh.pop(seq.seq_id, None) is not None and not fresh:
            del self._fresh[key]

    def requeued(self, seq: Sequence) -> None:
        """A running sequence was preempted back into the queue."""
        key = seq.fairness_key
        self.waiting[key] = self.waiting.get(key, 0) + 1

    def finished(self, seq: Sequence, *, was_waiting: bool) -> bool:
        """A sequence ended; True when its key has nothing left and was forgotten."""
        key = seq.fairness_key
        if was_waiting:
            self._leave_waiting(key)
            fresh = self._fresh.get(key)
            if fresh is not None and fresh.pop(seq.seq_id, None) is not None and not fresh:
                del self._fresh[key]
        live = self._live.get(key, 0) - 1
        if live > 0:
            self._live[key] = live
            return False
        self._live.pop(key, None)
        self._weights.pop(key, None)
        self.waiting.pop(key, None)
        self._fresh.pop(key, None)
        return True

    def _leave_waiting(self, key: str) -> None:
        left = self.waiting.get(key, 0) - 1
        if left > 0:
            self.waiting[key] = left
        else:
            self.waiting.pop(key, None)

    def make_room(
        self, key: str, n: int, need: int, capacity: int, *, weight: float | None = None
    ) -> list[str] | None:
        """Request ids to refuse so that `n` sequences of `key` fit; None: refuse `key`'s.

        `need` is how many waiting slots must be freed; `weight` is `key`'s share if
        given with this request. Only a key under its share may take slots back, and
        only from keys over theirs, newest sequences first.
        """
        counts = dict(self.waiting)
        own = check_weight(weight) if weight is not None else self.weight(key)
        total_weight = sum(self.weight(k) for k in counts if k != key) + own
        if not within_share(counts.get(key, 0), n, own, total_weight, capacity):
            return None
        victims: list[str] = []
        taken: dict[str, int] = {}
        while need > 0:
            victim = self._most_over(key, counts, taken, total_weight, capacity)
            if victim is None:
                return None
            fresh = self._fresh[victim]
            seqs = list(fresh.values())[: len(fresh) - taken.get(victim, 0)]
            request_id = seqs[-1].request_id
            freed = sum(1 for s in seqs if s.request_id == request_id)
            victims.append(request_id)
            taken[victim] = taken.get(victim, 0) + freed
            counts[victim] -= freed
            need -= freed
        return victims

    def _most_over(
        self,
        key: str,
        counts: dict[str, int],
        taken: dict[str, int],
        total_weight: float,
        capacity: int,
    ) -> str | None:
        """The key (not `key`) most over its share that still has a fresh sequence."""
        best: tuple[float, str] | None = None
        for k, count in counts.items():
            if k == key or len(self._fresh.get(k, ())) <= taken.get(k, 0):
                continue
            w = self.weight(k)
            if within_share(count, 0, w, total_weight, capacity):
                continue  # at or under its share: nothing to take back
            over = count - capacity * w / total_weight  # slots beyond its share
            if best is None or over > best[0]:
                best = (over, k)
        return None if best is None else best[1]


def check_weight(weight: float) -> float:
    """A positive share, as a float."""
    if not weight > 0:
        raise ValueError(f"a scheduling weight must be positive, got {weight}")
    return float(weight)
