"""Which adapter sits in which device slot; pure bookkeeping, no tensors.

An adapter needs a slot for the steps that compute its rows. The scheduler `pin`s
an adapter for each of its live sequences (admission to end, preemptions
included); a slot with no live sequence is idle, reused least recently used first.

When more adapters have work than there are slots, slots rotate between steps:
an adapter that has held its slot for `quantum` steps gives it to the adapter
that has waited longest (`wanting`, first come first served), and its own
sequences pause, keeping their KV, until it is its turn again. A slot never
changes under a step (`begin_step` is the only place a pinned adapter leaves its
slot, before the step's batch is chosen), so every scheduled row reads its own
adapter's weights. Without the rotation a slot under steady traffic never
empties, and a request for an adapter without one waits for a whole generation
or more (SGLang: median TTFT 40 ms -> 6.3 s with 16 adapters on 8 slots); with it,
the wait is about a quantum, and the cost is the paused sequences' slower decode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Set

# Steps an adapter keeps its slot before it gives way to one that waits (LoraConfig's
# lora_slot_quantum): short for a low TTFT, long enough that copies to the device stay rare.
DEFAULT_QUANTUM = 4


class AdapterSlots:
    """`max_loras` slots: `place` and `pin` per sequence, `begin_step` rotates, and
    `take_loads` tells the runner what to copy."""

    def __init__(self, max_loras: int, quantum: int = DEFAULT_QUANTUM) -> None:
        if quantum < 1:
            raise ValueError("the slot quantum is at least one step")
        self.max_loras = max_loras
        self.quantum = quantum
        self._slot_of: dict[str, int] = {}  # resident adapter -> its slot
        self._users: dict[str, set[str]] = {}  # adapter -> its live seq ids (any slot)
        self._free = list(range(max_loras - 1, -1, -1))
        self._idle: OrderedDict[str, None] = OrderedDict()  # residents with no user, LRU first
        self._wanting: OrderedDict[str, None] = OrderedDict()  # no slot, work waits; oldest first
        self._since: dict[str, int] = {}  # resident adapter -> the step its slot was given
        self._step = 0
        self._loads: dict[int, str] = {}  # slots to fill before the next step

    # -- the scheduler's calls ----------------------------------------------------------

    def begin_step(self, wanted: Set[str]) -> None:
        """Before a step's batch is chosen: forgets waiting adapters not in `wanted` (their
        requests ended), then gives slots to waiting adapters, rotating residents out
        that had their quantum."""
        self._step += 1
        for adapter in [a for a in self._wanting if a not in wanted]:
            del self._wanting[adapter]
        self._grant(rotate=True)

    def slot(self, adapter: str) -> int | None:
        """The adapter's slot for this step; None while it waits for one."""
        return self._slot_of.get(adapter)

    def place(self, adapter: str) -> int | None:
        """The adapter's slot, given now if one is free or idle; else None, and the adapter
        waits in line for a slot (it gets one at a later `begin_step`)."""
        slot = self._slot_of.get(adapter)
        if slot is not None:
            return slot
        self._wanting.setdefault(adapter, None)
        self._grant(rotate=False)  # mid-step: only slots no scheduled row reads
        return self._slot_of.get(adapter)

    def pin(self, seq_id: str, adapter: str) -> None:
        """Records a live sequence of `adapter` (admitted; it stays live until `release`)."""
        self._users.setdefault(adapter, set()).add(seq_id)
        self._idle.pop(adapter, None)

    def release(self, seq_id: str, adapter: str) -> None:
        """Ends `seq_id`'s use; an adapter with no user left stays resident, evictable."""
        users = self._users.get(adapter)
        if users is None:
            return
        users.discard(seq_id)
        if not users:
            del self._users[adapter]
            if adapter in self._slot_of:
                self._idle[adapter] = None

    # -- granting slots -----------------------------------------------------------------

    def _grant(self, *, rotate: bool) -> None:
        # Those in line now, in order; one rotated out here waits for a later step.
        for adapter in list(self._wanting):
            slot = self._open_slot(rotate=rotate)
            if slot is None:
                return
            del self._wanting[adapter]
            self._slot_of[adapter] = slot
            self._since[adapter] = self._step
            self._loads[slot] = adapter
            if adapter not in self._users:
                self._idle[adapter] = None

    def _open_slot(self, *, rotate: bool) -> int | None:
        """A free slot, else an idle one (not given this step), else, when rotating, the slot
        of the resident that has held one longest, if it had its quantum."""
        if self._free:
            return self._free.pop()
        victim = next((a for a in self._idle if self._since.get(a, 0) < self._step), None)
        if victim is not None:
            del self._idle[victim]
            return self._evict(victim)
        if not rotate:
            return None
        due = [a for a in self._users if a in self._slot_of]
        victim = min(due, key=lambda a: self._since[a], default=None)
        if victim is None or self._step - self._since[victim] < self.quantum:
            return None
        self._wanting[victim] = None  # its sequences pause; it waits its turn again
        return self._evict(victim)

    def _evict(self, adapter: str) -> int:
        self._since.pop(adapter, None)
        slot = self._slot_of.pop(adapter)
        self._loads.pop(slot, None)
        return slot

    # -- the engine's calls -------------------------------------------------------------

    def in_use(self, adapter: str) -> bool:
        """True while a live sequence uses `adapter`."""
        return adapter in self._users

    def drop(self, adapter: str) -> None:
        """Frees an unused adapter's slot (it was unloaded or replaced)."""
        if self.in_use(adapter):
            raise RuntimeError(f"adapter {adapter!r} is in use")
        self._idle.pop(adapter, None)
        self._wanting.pop(adapter, None)
        if adapter in self._slot_of:
            self._free.append(self._evict(adapter))

    @property
    def has_loads(self) -> bool:
        """True when some slot must be filled before the next step runs."""
        return bool(self._loads)

    def take_loads(self) -> list[tuple[int, str]]:
        """(slot, adapter) pairs placed since the last call, to copy to the device."""
        loads, self._loads = list(self._loads.items()), {}
        return loads

    @property
    def resident(self) -> dict[str, int]:
        """Adapter -> slot, for every adapter on the device."""
        return dict(self._slot_of)

    @property
    def wanting(self) -> tuple[str, ...]:
        """Adapters with work and no slot, in the order they get one."""
        return tuple(self._wanting)

    def check_integrity(self) -> None:
        """Asserts every slot is free or held by exactly one adapter (tests)."""
        held = sorted(self._slot_of.values())
        assert len(held) == len(set(held)), held
        assert sorted(held + self._free) == list(range(self.max_loras))
        assert set(self._idle) | (set(self._users) & set(self._slot_of)) == set(self._slot_of)
        assert not set(self._idle) & set(self._users)
        assert not set(self._wanting) & set(self._slot_of), self._wanting
        assert set(self._since) == set(self._slot_of)
