"""Small helpers shared by the kernels: host-side ones for the launchers, and the one
piece of score math both attention kernels run (`softcap_scores`)."""

# triton.jit is untyped (the jitted helper below); the host helpers are fully typed.
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The window the attention kernels take for "no sliding window": longer than any context.
NO_WINDOW = 1 << 30
# The soft cap the attention kernels take for "no cap" (their SOFTCAP flag is off then).
NO_SOFTCAP = 0.0


@triton.jit
def softcap_scores(s, cap):
    """cap * tanh(s / cap) (Gemma 2's attention scores). triton has no tanh: this is
    1 - 2 / (exp(2x) + 1), which saturates to +-1 (exp overflowing to inf, or 0) rather
    than giving NaN."""
    e = tl.exp(2.0 * (s / cap))
    return cap * (1.0 - 2.0 / (e + 1.0))


class KernelInputError(ValueError):
    """A kernel launcher got tensors whose shape, dtype or device it cannot handle."""


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1): triton tiles must have power-of-two sizes."""
    return int(triton.next_power_of_2(max(1, n)))


def dot_precision(dtype: torch.dtype) -> str:
    """The `tl.dot` input precision: exact fp32 for fp32 tensors (no TF32 rounding)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; a nominal 1 elsewhere (the interpreter)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 1


def require_same_device(*tensors: torch.Tensor) -> None:
    """Raises KernelInputError unless every tensor lives on the same device."""
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise KernelInputError(f"tensors on different devices: {sorted(map(str, devices))}")


def require_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """The kernels address the innermost dimension with unit stride."""
    if t.stride(-1) != 1:
        raise KernelInputError(f"{name} must be contiguous in its last dimension")
