"""The waiting queue: which waiting sequence is considered for admission next."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Set
from typing import Protocol

from engine.sequence import Sequence


class WaitingQueue(Protocol):
    """Order of admission. `peek` names the next candidate without removing it."""

    def __len__(self) -> int:
        """Number of waiting sequences."""
        ...

    def __iter__(self) -> Iterator[Sequence]:
        """Waiting sequences, in no particular order."""
        ...

    def push(self, seq: Sequence) -> None:
        """Adds a newly arrived sequence."""
        ...

    def push_front(self, seq: Sequence) -> None:
        """Returns a preempted sequence, ahead of newer arrivals."""
        ...

    def peek(self, skip: Set[str] = frozenset()) -> Sequence | None:
        """The next sequence to admit, or None when empty. Sequences whose ids are in
        `skip` (held back this step: they wait for an adapter slot) are passed over."""
        ...

    def pop(self, seq: Sequence) -> None:
        """Removes `seq` (the one `peek` returned) after its admission."""
        ...

    def remove(self, seq: Sequence) -> bool:
        """Removes `seq` wherever it is (abort); False if it was not queued."""
        ...

    def charge(self, seq: Sequence, tokens: int) -> None:
        """Records `tokens` of service (prompt tokens + 2 x output tokens) given to `seq`."""
        ...

    def set_weight(self, domain: str, weight: float) -> None:
        """Sets a domain's share for policies that weigh domains (others ignore it)."""
        ...

    def forget(self, key: str) -> None:
        """Drops what the policy keeps for a fairness key with nothing waiting or running."""
        ...

    def served(self, key: str) -> float | None:
        """The key's weighted service so far, for policies that order keys by it (others:
        None)."""
        ...


class FcfsQueue:
    """First come, first served; preempted sequences go back to the front."""

    def __init__(self) -> None:
        self._q: deque[Sequence] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._q)

    def push(self, seq: Sequence) -> None:
        """Appends at the back."""
        self._q.append(seq)

    def push_front(self, seq: Sequence) -> None:
        """Puts back at the front."""
        self._q.appendleft(seq)

    def peek(self, skip: Set[str] = frozenset()) -> Sequence | None:
        """The oldest waiting sequence not in `skip`."""
        if not skip:
            return self._q[0] if self._q else None
        return next((seq for seq in self._q if seq.seq_id not in skip), None)

    def pop(self, seq: Sequence) -> None:
        """Removes the head (which must be `seq`)."""
        if self._q and self._q[0] is seq:
            self._q.popleft()
        else:
            self._q.remove(seq)

    def remove(self, seq: Sequence) -> bool:
        """Removes `seq` if present."""
        try:
            self._q.remove(seq)
        except ValueError:
            return False
        return True

    def charge(self, seq: Sequence, tokens: int) -> None:
        """FCFS keeps no service accounts."""

    def set_weight(self, domain: str, weight: float) -> None:
        """FCFS ignores weights."""

    def served(self, key: str) -> float | None:
        """FCFS does not order by service."""
        return None

    def forget(self, key: str) -> None:
        """FCFS keeps nothing per key."""
