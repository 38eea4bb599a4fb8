"""LoRA adapters as an engine client sees them: what a loaded one is, and the error of
an engine that cannot unload one in use. The record and the in-use error are the
engine's own types, on both transports.

The engine front (D1's engine side) loads adapters by name from a PEFT folder; the
gateway names them on `EngineRequest.adapter` (gateway.adapters: how a request names
one).
"""

from __future__ import annotations

from engine.errors import AdapterInUseError
from engine.lora.peft import AdapterInfo

__all__ = ["AdapterInUseError", "AdapterInfo"]
