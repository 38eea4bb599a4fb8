"""The model families the engine runs, by the names checkpoints declare.

A Hugging Face folder declares `architectures` in config.json, a GGUF file
`general.architecture`. Adding a family is one module under engine/model/families/
plus one line in FAMILIES.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from engine.errors import UnsupportedModelError
from engine.model.families import (
    gemma2,
    gemma3,
    llama,
    mistral,
    mixtral,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from engine.model.families.base import Family

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    mistral.FAMILY,
    phi3.FAMILY,
    mixtral.FAMILY,
    qwen3_moe.FAMILY,
    gemma2.FAMILY,
    gemma3.FAMILY,
)

# Hugging Face architecture class name -> family.
SUPPORTED: Mapping[str, Family] = MappingProxyType(
    {arch: family for family in FAMILIES for arch in family.hf_architectures}
)
# GGUF `general.architecture` -> family.
GGUF_SUPPORTED: Mapping[str, Family] = MappingProxyType(
    {arch: family for family in FAMILIES for arch in family.gguf_architectures}
)
_BY_NAME: Mapping[str, Family] = MappingProxyType({f.name: f for f in FAMILIES})


def family_of_config(config: Mapping[str, Any]) -> Family:
    """The family a config.json declares; refused with the supported list otherwise."""
    declared = list(config.get("architectures") or [])
    for name in declared:
        if name in SUPPORTED:
            return SUPPORTED[name]
    raise UnsupportedModelError(
        f"model architecture {declared or config.get('model_type')!r} is not supported; "
        f"supported: {', '.join(SUPPORTED)}"
    )


def family_of_gguf(architecture: Any) -> Family:
    """The family of a GGUF `general.architecture`; refused with the supported list."""
    family = GGUF_SUPPORTED.get(architecture) if isinstance(architecture, str) else None
    if family is None:
        raise UnsupportedModelError(
            f"GGUF architecture {architecture!r} is not supported; "
            f"supported: {', '.join(GGUF_SUPPORTED)}"
        )
    return family


def family_named(name: str) -> Family:
    """A family by our own name for it (ModelArchitecture.architecture)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnsupportedModelError(
            f"unknown model family {name!r}; known: {', '.join(_BY_NAME)}"
        ) from None
