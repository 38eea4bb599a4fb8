"""Which quantized layout a Hugging Face checkpoint declares, and its dequantizer.

A config's `quantization_config` picks one scheme: FP8 (engine/model/fp8_checkpoint.py),
GPTQ or AWQ (gptq_awq_checkpoint.py), or compressed-tensors' packed integers
(packed_int_checkpoint.py). Each turns the checkpoint's tensor stream into plain
float32 weights at load, so every device and every family runs them; anything else is
refused by name before a weight is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from engine.errors import UnsupportedModelError
from engine.model.fp8_checkpoint import fp8_scheme
from engine.model.gptq_awq_checkpoint import grouped_int_scheme
from engine.model.packed_int_checkpoint import packed_int_scheme


class CheckpointScheme(Protocol):
    """A quantized checkpoint layout: its name and how its tensors decode."""

    @property
    def label(self) -> str:
        """A short name for people ("GPTQ 4-bit g128")."""
        ...

    def dequantized(
        self, weights: Iterable[tuple[str, torch.Tensor]], files: Iterable[Path]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's stream of tensors as plain float weights."""
        ...


_READERS = (fp8_scheme, grouped_int_scheme, packed_int_scheme)


def checkpoint_scheme(config: Mapping[str, Any]) -> CheckpointScheme | None:
    """The scheme of a config's `quantization_config`, None when it declares none."""
    quantized = config.get("quantization_config")
    if not quantized:
        return None
    if not isinstance(quantized, Mapping):
        raise UnsupportedModelError(f"quantization_config must be an object, not {quantized!r}")
    for reader in _READERS:
        scheme: CheckpointScheme | None = reader(quantized)
        if scheme is not None:
            return scheme
    raise UnsupportedModelError(
        f"quantized checkpoints of method {quantized.get('quant_method')!r} "
        f"(format {quantized.get('format')!r}) are not supported; FP8, GPTQ, AWQ and "
        "compressed-tensors' float-quantized and pack-quantized ones are"
    )
