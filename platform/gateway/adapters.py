"""LoRA adapters as the gateway sees them: what a loaded one is, how a request names one.

A request selects an adapter with `model` = "base-model:adapter-name". The engine front
(D1's engine side) loads adapters by name from a PEFT folder; the gateway only names
them on `EngineRequest.adapter`. Engines that serve no adapters raise
`AdaptersUnsupportedError` from every adapter call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError

SEPARATOR = ":"  # base-model:adapter-name


@dataclass(frozen=True)
class AdapterInfo:
    """One adapter loaded on an engine."""

    name: str
    rank: int
    alpha: float
    digest: str
    target_modules: tuple[str, ...] = ()
    # Where its weights are: "device" (in the adapter slots) or "host" (in host memory,
    # swapped out); None when the engine does not say.
    location: str | None = None


class AdaptersUnsupportedError(EngineError):
    """This engine does not serve adapters (its front has no adapter calls)."""


class AdapterInUseError(EngineError):
    """An adapter cannot be unloaded while requests use it; try again later."""


def split_model(name: str) -> tuple[str, str | None]:
    """("base", "adapter") for "base:adapter", (name, None) for a plain model name."""
    base, sep, adapter = name.partition(SEPARATOR)
    if not sep or not base or not adapter:
        return name, None
    return base, adapter


def adapter_info(obj: Any) -> AdapterInfo:
    """An `AdapterInfo` copied out of an engine front's adapter record (any object with
    the same fields; a front may lack `target_modules`)."""
    if isinstance(obj, AdapterInfo):
        return obj
    return AdapterInfo(
        name=str(obj.name),
        rank=int(obj.rank),
        alpha=float(obj.alpha),
        digest=str(obj.digest),
        target_modules=tuple(str(m) for m in getattr(obj, "target_modules", ()) or ()),
        location=None if getattr(obj, "location", None) is None else str(obj.location),
    )


def is_in_use_error(exc: BaseException) -> bool:
    """Whether `exc` is the engine's AdapterInUseError (matched by name: the gateway does
    not import the engine's LoRA modules, which may not exist on every engine)."""
    return isinstance(exc, AdapterInUseError) or type(exc).__name__ == "AdapterInUseError"
