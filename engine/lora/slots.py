"""Which adapter sits in which device slot; pure bookkeeping, no tensors.

A slot is pinned while any sequence of its adapter is live (from its admission to
its end, preemptions included), and only an unpinned slot is ever reassigned:
the least recently used one first. The scheduler asks `acquire` in its fair
admission order and stops admitting when it fails, so a request waiting for a
slot is not overtaken by later ones (no tenant's stream can starve another's).
"""

from __future__ import annotations

from collections import OrderedDict


class AdapterSlots:
    """`max_loras` slots; `acquire`/`release` per sequence, `take_loads` for the runner."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self._slot_of: dict[str, int] = {}  # adapter -> its slot
        self._users: dict[str, set[str]] = {}  # adapter -> live seq ids pinning it
        self._free = list(range(max_loras - 1, -1, -1))
        self._idle: OrderedDict[str, None] = OrderedDict()  # unpinned residents, LRU first
        self._loads: dict[int, str] = {}  # slots to fill before the next step

    def acquire(self, seq_id: str, adapter: str) -> int | None:
        """Pins `adapter`'s slot for `seq_id` (placing it if needed); None when all are in use."""
        slot = self._slot_of.get(adapter)
        if slot is None:
            if self._free:
                slot = self._free.pop()
            elif self._idle:
                victim, _ = self._idle.popitem(last=False)
                slot = self._slot_of.pop(victim)
            else:
                return None
            self._slot_of[adapter] = slot
            self._loads[slot] = adapter
        self._idle.pop(adapter, None)
        self._users.setdefault(adapter, set()).add(seq_id)
        return slot

    def release(self, seq_id: str, adapter: str) -> None:
        """Unpins `seq_id`'s use; an adapter with no user left stays resident, evictable."""
        users = self._users.get(adapter)
        if users is None:
            return
        users.discard(seq_id)
        if not users:
            del self._users[adapter]
            if adapter in self._slot_of:
                self._idle[adapter] = None

    def in_use(self, adapter: str) -> bool:
        """True while a live sequence pins `adapter`."""
        return adapter in self._users

    def drop(self, adapter: str) -> None:
        """Frees an unpinned adapter's slot (it was unloaded)."""
        if self.in_use(adapter):
            raise RuntimeError(f"adapter {adapter!r} is in use")
        self._idle.pop(adapter, None)
        slot = self._slot_of.pop(adapter, None)
        if slot is not None:
            self._loads.pop(slot, None)
            self._free.append(slot)

    def take_loads(self) -> list[tuple[int, str]]:
        """(slot, adapter) pairs placed since the last call, to copy to the device."""
        loads, self._loads = list(self._loads.items()), {}
        return loads

    @property
    def resident(self) -> dict[str, int]:
        """Adapter -> slot, for every adapter on the device."""
        return dict(self._slot_of)

    def check_integrity(self) -> None:
        """Asserts every slot is free or held by exactly one adapter (tests)."""
        held = sorted(self._slot_of.values())
        assert len(held) == len(set(held)), held
        assert sorted(held + self._free) == list(range(self.max_loras))
        assert set(self._idle) | set(self._users) == set(self._slot_of)
