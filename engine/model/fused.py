"""Which elementwise ops the Llama decoder runs as fused triton kernels.

`fused_ops` in ModelConfig: "auto" is on exactly when the device is CUDA and triton
imports; "on" insists (and says why it cannot, rather than failing at the first
step); "off" keeps the torch code, the reference and the CPU default. The kernels
(engine/kernels/fused_ops.py) are imported only when they will run, because triton
reads TRITON_INTERPRET at the import of a kernel module and is an optional
dependency.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.config import FusedOpsMode


class FusedOpsUnavailableError(ValueError):
    """`fused_ops="on"` on a machine where the triton kernels cannot run."""


@dataclass(frozen=True)
class FusedOps:
    """The three kernels the model calls, with the signatures of engine.kernels.fused_ops."""

    # (x, residual | None, weight, eps) -> (normed, x + residual); both new tensors
    # except that, with residual None, the second is x itself.
    add_rms_norm: Callable[
        [torch.Tensor, torch.Tensor | None, torch.Tensor, float],
        tuple[torch.Tensor, torch.Tensor],
    ]
    # (q [T, Hq, D], k [T, Hk, D], positions [T], cos, sin): rotates q and k in place.
    rotary_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]
    # [T, 2I] (gate then up) -> [T, I].
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]


def triton_importable() -> bool:
    """True when the triton package is installed (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def kernels_interpreted() -> bool:
    """True when the fused kernels run in triton's interpreter (CPU tensors work then)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    from engine.kernels import fused_ops

    # Decorated before TRITON_INTERPRET was set, they stay compiled-mode objects.
    return type(fused_ops._add_rms_norm_kernel).__name__ == "InterpretedFunction"


def resolve_fused_ops(mode: FusedOpsMode, device: torch.device) -> bool:
    """Whether the model runs the fused kernels for `mode` on `device`.

    Raises FusedOpsUnavailableError for "on" without triton, or on a non-CUDA device
    unless the kernels run in triton's interpreter (TRITON_INTERPRET=1, as in tests).
    """
    if mode == "off":
        return False
    if mode == "auto":
        return device.type == "cuda" and triton_importable()
    if mode != "on":
        raise FusedOpsUnavailableError(f"fused_ops must be auto, on or off, not {mode!r}")
    if not triton_importable():
        raise FusedOpsUnavailableError("fused_ops is 'on' but triton is not installed")
    if device.type != "cuda" and not kernels_interpreted():
        raise FusedOpsUnavailableError(
            f"fused_ops is 'on' but the device is {device.type!r}: the triton kernels need "
            "CUDA, or TRITON_INTERPRET=1 set before the kernels are first imported"
        )
    return True


def load_fused_ops() -> FusedOps:
    """Imports the triton kernels (compiled or interpreted, as TRITON_INTERPRET says)."""
    from engine.kernels.fused_ops import apply_rotary_, fused_add_rms_norm, silu_and_mul

    return FusedOps(
        add_rms_norm=fused_add_rms_norm, rotary_=apply_rotary_, silu_and_mul=silu_and_mul
    )
