"""LoRA adapters as a request names them: `model` = "base-model:adapter-name".

What a loaded adapter is, and the adapter errors, are engine_hop.adapters'.
"""

from __future__ import annotations

SEPARATOR = ":"  # base-model:adapter-name


def split_model(name: str) -> tuple[str, str | None]:
    """("base", "adapter") for "base:adapter", (name, None) for a plain model name."""
    base, sep, adapter = name.partition(SEPARATOR)
    if not sep or not base or not adapter:
        return name, None
    return base, adapter
