"""LoRA adapters as an engine client sees them: what a loaded one is, and the errors of
an engine that serves none or cannot unload one in use.

The engine front (D1's engine side) loads adapters by name from a PEFT folder; the
gateway names them on `EngineRequest.adapter` (gateway.adapters: how a request names
one). Engines that serve no adapters raise `AdaptersUnsupportedError` from every
adapter call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import EngineError


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


def adapter_info(obj: Any) -> AdapterInfo:
    """An `AdapterInfo` copied out of an engine front's adapter record
    (engine.lora.peft.AdapterInfo, or any object with the same fields)."""
    if isinstance(obj, AdapterInfo):
        return obj
    return AdapterInfo(
        name=str(obj.name),
        rank=int(obj.rank),
        alpha=float(obj.alpha),
        digest=str(obj.digest),
        target_modules=tuple(str(m) for m in obj.target_modules or ()),
        location=None if obj.location is None else str(obj.location),
    )


def is_in_use_error(exc: BaseException) -> bool:
    """Whether `exc` is the engine's AdapterInUseError (matched by name: the gateway does
    not import the engine's LoRA modules, which may not exist on every engine)."""
    return isinstance(exc, AdapterInUseError) or type(exc).__name__ == "AdapterInUseError"
