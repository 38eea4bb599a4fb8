"""The adapters loaded into an engine: their identity, folder and host-memory weights."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

from engine.config import ModelArchitecture
from engine.errors import AdapterNotFoundError, InvalidAdapterError
from engine.lora.peft import AdapterInfo, AdapterWeights, read_peft_adapter


@dataclass(frozen=True)
class _Entry:
    info: AdapterInfo
    path: str


class AdapterRegistry:
    """Name -> adapter; keeps at most `max_cpu_loras` adapters' weights in host memory.

    An adapter whose weights were dropped from the host LRU is read again from its
    folder when a slot needs it, and refused if the files changed since it was loaded.
    """

    def __init__(self, arch: ModelArchitecture, max_rank: int, max_cpu_loras: int | None) -> None:
        self.arch = arch
        self.max_rank = max_rank
        self.max_cpu_loras = max_cpu_loras
        self._entries: dict[str, _Entry] = {}
        self._host: OrderedDict[str, AdapterWeights] = OrderedDict()

    def add(self, name: str, path: str) -> AdapterInfo:
        """Reads and registers an adapter (replacing one of the same name)."""
        weights = read_peft_adapter(name, path, self.arch, self.max_rank)
        self._entries[name] = _Entry(weights.info, path)
        self._cache(name, weights)
        return weights.info

    def remove(self, name: str) -> None:
        """Forgets an adapter."""
        self.info(name)
        del self._entries[name]
        self._host.pop(name, None)

    def info(self, name: str) -> AdapterInfo:
        """The adapter's info; AdapterNotFoundError when it is not loaded."""
        entry = self._entries.get(name)
        if entry is None:
            raise AdapterNotFoundError(f"adapter {name!r} is not loaded", param="adapter")
        return entry.info

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def all(self) -> list[AdapterInfo]:
        """Every loaded adapter, by name."""
        return [self._entries[n].info for n in sorted(self._entries)]

    def weights(self, name: str) -> AdapterWeights:
        """The adapter's matrices, from host memory or read again from its folder."""
        cached = self._host.get(name)
        if cached is not None:
            self._host.move_to_end(name)
            return cached
        entry = self._entries[name]
        weights = read_peft_adapter(name, entry.path, self.arch, self.max_rank)
        if weights.info.digest != entry.info.digest:
            raise InvalidAdapterError(
                f"adapter {name!r} changed on disk since it was loaded; load it again"
            )
        self._cache(name, weights)
        return weights

    def _cache(self, name: str, weights: AdapterWeights) -> None:
        self._host[name] = weights
        self._host.move_to_end(name)
        if self.max_cpu_loras is not None:
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)

    def host_resident(self) -> tuple[str, ...]:
        """Names of the adapters whose weights are in host memory."""
        return tuple(sorted(self._host))

    @property
    def num_host_resident(self) -> int:
        """Adapters whose weights are in host memory."""
        return len(self._host)


def located(info: AdapterInfo, device: Collection[str], host: Collection[str]) -> AdapterInfo:
    """`info` with where its weights are: in a device slot, in host memory, or on disk."""
    where = "device" if info.name in device else "host" if info.name in host else "disk"
    return dataclasses.replace(info, location=where)
