"""Reading a checkpoint's small side tensors (scales, zero points) ahead of its weights.

A quantized linear's packed weight and its scales may sit in different shards, so the
scales (a small fraction of the weights) are read first and the weights streamed after.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open


def read_tensors_ending(
    files: Iterable[Path], suffixes: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Every tensor of the files whose name ends with one of `suffixes`, by name."""
    found: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if name.endswith(suffixes):
                    found[name] = f.get_tensor(name)
    return found
