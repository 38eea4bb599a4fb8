"""Choosing an attention backend by name and device.

Kept apart from the backend contract (`backend.py`) so that the implementations can
import the contract while this module imports the implementations, with no circle.
"""

from __future__ import annotations

import torch

from engine.attention import cpu_kernels
from engine.attention.backend import AttentionBackend
from engine.attention.cpu_backend import CpuAttentionBackend
from engine.attention.torch_backend import TorchAttentionBackend
from engine.config import AttentionBackendName


def get_attention_backend(name: AttentionBackendName, device: torch.device) -> AttentionBackend:
    """Picks a backend: `auto` means triton on CUDA, elsewhere the CPU kernels where numba
    is installed and the torch reference otherwise."""
    if name == "auto":
        if device.type == "cuda":
            name = "triton"
        else:
            name = "cpu" if device.type == "cpu" and cpu_kernels.available() else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not on {device.type!r}")
        if not cpu_kernels.available():
            raise ValueError("the cpu attention backend needs numba: pip install numba")
        return CpuAttentionBackend()
    if name == "triton":
        # triton is an optional extra (`gpu`); only a triton backend may need it.
        from engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose torch, cpu, triton or auto")
