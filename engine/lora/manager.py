"""An engine's adapters: the registry (host), the slots (bookkeeping), the stacks (device)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import torch

from engine.config import LoraConfig, ModelArchitecture
from engine.errors import AdapterInUseError, EngineError
from engine.lora.batch import LoraBatch
from engine.lora.peft import AdapterInfo
from engine.lora.registry import AdapterRegistry
from engine.lora.slots import AdapterSlots
from engine.lora.stacks import LoraStacks
from engine.scheduler.output import SchedulerOutput
from engine.sequence import Sequence


class LoraManager:
    """Loads and unloads adapters and fills the device slots the scheduler placed.

    The device stacks are allocated on the first load, so an engine that never
    serves an adapter spends no memory on them.
    """

    def __init__(
        self,
        config: LoraConfig,
        arch: ModelArchitecture,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.config = config
        self.arch = arch
        self.dtype = dtype
        self.device = device
        self.registry = AdapterRegistry(arch, config.max_lora_rank, config.max_cpu_loras)
        self.slots = AdapterSlots(config.max_loras, config.lora_slot_quantum)
        self.stacks: LoraStacks | None = None

    def load(self, name: str, path: str, live: Iterable[Sequence]) -> AdapterInfo:
        """Reads an adapter and serves it under `name`; a reload replaces the weights (and,
        through the digest in the cache key, never reuses the old KV)."""
        if name in self.registry and _users(name, live):
            raise AdapterInUseError(f"adapter {name!r} is in use; it cannot be replaced now")
        info = self.registry.add(name, path)  # raises before anything changes
        self.slots.drop(name)
        if self.stacks is None:
            self.stacks = LoraStacks(
                self.arch,
                max_loras=self.config.max_loras,
                max_rank=self.config.max_lora_rank,
                dtype=self.dtype,
                device=self.device,
            )
        return info

    def unload(self, name: str, live: Iterable[Sequence]) -> None:
        """Forgets an adapter; AdapterInUseError while a live request names it."""
        self.registry.info(name)
        count = _users(name, live)
        if count:
            raise AdapterInUseError(f"adapter {name!r} is used by {count} live sequences")
        self.slots.drop(name)
        self.registry.remove(name)

    def prepare_step(self) -> dict[str, EngineError]:
        """Copies the adapters placed since the last step into their device slots.

        Returns the adapters that could not be read again from their folder (changed
        or gone since they were loaded), with why: their requests must fail, and the
        caller frees their slots once they have (`slots.drop`).
        """
        failed: dict[str, EngineError] = {}
        for slot, name in self.slots.take_loads():
            assert self.stacks is not None
            try:
                self.stacks.load(slot, self.registry.weights(name))
            except EngineError as exc:
                failed[name] = exc
        return failed

    def batch(self, output: SchedulerOutput) -> LoraBatch | None:
        """The step's per-row slots, grouped; None when no scheduled sequence has an adapter."""
        if self.stacks is None:
            return None
        rows: list[int | None] = []
        for item in output.scheduled:
            rows.extend([item.seq.lora_slot] * item.num_new_tokens)
        kernel = self.config.lora_kernel == "triton"
        return LoraBatch.build(self.stacks, rows, self.device, kernel=kernel)

    def counts(
        self, running: Iterable[Sequence], waiting: Iterable[Sequence]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """Sequences per adapter: (running, waiting), adapters with none left out."""
        if not self.registry.all():
            return {}, {}
        run = Counter(s.adapter for s in running if s.adapter_digest is not None)
        wait = Counter(s.adapter for s in waiting if s.adapter_digest is not None)
        return _named(run), _named(wait)


def _users(name: str, live: Iterable[Sequence]) -> int:
    return sum(1 for s in live if s.adapter == name and s.adapter_digest is not None)


def _named(counts: Counter[str | None]) -> dict[str, int]:
    return {k: v for k, v in sorted(counts.items(), key=lambda kv: str(kv[0])) if k is not None}
