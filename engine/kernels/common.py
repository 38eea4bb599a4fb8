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


def check_paged_attention_inputs(
    q: torch.Tensor, kv_cache: torch.Tensor, softcap: float | None
) -> tuple[int, int]:
    """Checks what both attention launchers take: q [tokens, heads, head_dim] against the
    paged cache [2, blocks, block_size, kv_heads, head_dim], and the soft cap. Returns
    (block_size, num_kv_heads); raises KernelInputError on a mismatch."""
    _, num_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, cache_dim = kv_cache.shape
    if cache_dim != head_dim or num_heads % num_kv_heads != 0:
        raise KernelInputError(f"q {tuple(q.shape)} does not fit the cache {tuple(kv_cache.shape)}")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise KernelInputError("q and kv_cache must be contiguous in head_dim")
    if softcap is not None and not softcap > 0:
        raise KernelInputError(f"softcap must be positive, not {softcap}")
    return block_size, num_kv_heads


def paged_attention_strides(
    q: torch.Tensor, out: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor
) -> tuple[int, ...]:
    """The strides both attention kernels take, in their order: q's and out's (token,
    head), the cache's (K/V, block, token, KV head) and a block table row's."""
    return (
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *kv_cache.stride()[:4],
        block_tables.stride(0),
    )


def window_and_softcap(window: int | None, softcap: float | None) -> tuple[int, float]:
    """The (window, softcap) kernel arguments: NO_WINDOW and NO_SOFTCAP for None."""
    return (NO_WINDOW if window is None else window, NO_SOFTCAP if softcap is None else softcap)
