"""Weight-only quantized linears for the CPU: int8 per output row, or int4 in groups of 32.

Why: at decode batch sizes the step is bound by reading the weights, and torch's fp32
GEMM at M=8 streams them far below the memory bandwidth on a small CPU. The packed
int4/int8 kernels read 8x/4x fewer bytes and measured 2-3x faster there.

`weight_quant` in ModelConfig:
  "none"  the model's own dtype (the reference).
  "int8"  every linear (the decoder's and the LM head) int8, one scale per row.
  "int4"  the decoder's linears int4 with a scale and a zero per 32 inputs, the LM head
          int8. The bundled SmolLM2 GGUF stores its decoder as Q4_1 (exactly this
          grid: min + d*q, q in 0..15, per 32 weights) and its embeddings as Q8_0, so
          on it int4 re-finds the stored weights up to the bf16 rounding of the scales.
  "auto"  one of those, from the model file and the device (`choose_weight_quant`):
          a quantized GGUF's own fast path on the CPU, "none" for float checkpoints
          and on any other device. `cloister serve`'s default.

The kernels win only at decode sizes: from about 32 rows up torch's float GEMM is
faster (measured per 16 of SmolLM2's products, 1 thread: 8 rows fp32 116 ms, int4
41 ms; 24 rows 176 / 144; 64 rows 242 / 332; 256 rows 741 / 1271), so a product of
more than `QUANT_MAX_ROWS` rows (a prefill) runs on float weights. Where the CPU
multiplies bf16 natively (AVX-512 BF16 or AMX: oneDNN's bf16 GEMM), those are a bf16
copy of the weights, since a bf16 prefill there takes a third of the time of fp32's
(SmolLM2, one 200-token prompt on 2 AVX-512 BF16 cores: 315 ms on the fp32 weights,
96 ms on the bf16 copy);
elsewhere bf16 GEMMs are emulated and slower, and the model's own weights serve.

The kernels take bfloat16 activations (their fp32/fp16 paths are scalar and far
slower), so a layer's input is rounded to bf16 for the product and the result is
returned in the input's dtype; norms, rotary, attention and the residual stream stay
in the model's dtype. The float weights stay in the model (the embedding lookup and
LoRA read them, and `quantize_weights("none")` goes back to them).
"""

from __future__ import annotations

import math
import struct
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

WeightQuant = Literal["none", "int8", "int4"]
WEIGHT_QUANT_MODES: tuple[WeightQuant, ...] = ("none", "int8", "int4")
# The setting: a mode, or "auto" (`choose_weight_quant` picks one from the model file).
WeightQuantSetting = Literal["auto", "none", "int8", "int4"]
WEIGHT_QUANT_SETTINGS: tuple[WeightQuantSetting, ...] = ("auto", *WEIGHT_QUANT_MODES)
# The CPU path `auto` picks for a GGUF whose decoder is mostly stored in this type.
# 4-bit grids in blocks of 32 (or sub-blocks of 32: Q4_K, IQ4_XS) go to int4, whose own
# grid (min + d*q per 32 inputs) holds them (Q4_1 exactly; the others re-rounded within
# half a step). Wider grids (5, 6, 8 bits) and the 2-3 bit K-quants go to int8, one
# scale per row: int4 would add an error as large as their own grid's, int8 keeps them
# within about 1/127 of a row's range. Float types (and any other) stay "none".
GGUF_AUTO_QUANT: dict[str, WeightQuant] = {
    **dict.fromkeys(("Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS"), "int4"),
    **dict.fromkeys(("Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q2_K", "Q3_K"), "int8"),
}
INT4_GROUP = 32  # inputs per int4 scale/zero pair (the Q4_0/Q4_1 block size)
QUANT_MAX_ROWS = 24  # larger products (prefill) use the float weights: faster there
# With a bf16 copy on a CPU with native bf16 the crossover comes sooner (SmolLM2's
# products per layer, 2 AVX-512 BF16 cores: 8 rows int4 8.1 / bf16 8.4 ms; 16 rows
# 14.7 / 11.8; 24 rows 19.2 / 13.2; 64 rows 54.1 / 28.0).
QUANT_MAX_ROWS_BF16 = 12
# Inputs appended to the int8-activation products' rows, holding 1 and -1 so that the
# range fbgemm quantizes every row in is the same (see `int8_dynamic_linear`).
RANGE_COLUMNS = 2


class WeightQuantUnavailableError(ValueError):
    """`weight_quant` asked for where its kernels cannot run (a non-CPU device, a bad mode)."""


@dataclass(frozen=True)
class QuantPlan:
    """How a model's linears are quantized: `bits` (8 or 4), the rows above which a
    product leaves the packed kernels (None: never) and the dtype of the float weights
    it then runs on (None: the model's own; bf16: a copy)."""

    bits: int
    max_rows: int | None = QUANT_MAX_ROWS
    large_dtype: torch.dtype | None = None
    # Whether the LM head's small products quantize their activations too (per row, to
    # int8) and run on the CPU's int8 dot products (see `int8_dot_products`).
    head_int8_activations: bool = False

    def linear(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        bits: int | None = None,
        int8_activations: bool = False,
    ) -> QuantizedLinear:
        """`weight` (and `bias`) under this plan; `bits` overrides the plan's."""
        return QuantizedLinear(
            weight, bias, bits or self.bits, self.max_rows, self.large_dtype, int8_activations
        )


class QuantizedLinear:
    """y = x W^T (+ b) with W held as packed int8 or int4; call it like the Linear it replaces."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        max_rows: int | None = QUANT_MAX_ROWS,
        large_dtype: torch.dtype | None = None,
        int8_activations: bool = False,
    ) -> None:
        """`max_rows`: larger inputs use float weights (None: always the quantized ones):
        `weight` itself, or a copy in `large_dtype` (bf16 where it is native).
        `int8_activations` (8 bits only): the small products also round their inputs to
        int8, one scale per row, and run on fbgemm's int8 GEMM (VNNI; elsewhere on 7-bit
        inputs, see `int8_dynamic_linear`)."""
        if weight.device.type != "cpu":
            raise WeightQuantUnavailableError(
                f"weight_quant runs on the CPU only, not on {weight.device.type!r}"
            )
        self.bits = bits
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.weight = weight  # a reference (no copy): the model keeps its float weights
        self.max_rows = max_rows
        # The large products' weights: `weight` itself, or a copy in `large_dtype`.
        self.large_weight = (
            weight if large_dtype in (None, weight.dtype) else weight.detach().to(large_dtype)
        )
        w = weight.detach().float()
        # fbgemm's packed int8 weights, when the activations are quantized too.
        self.packed: torch.Tensor | None = None
        self.reduce_range = not vnni()
        if int8_activations and bits != 8:
            raise WeightQuantUnavailableError("int8 activations go with 8-bit weights only")
        if int8_activations:
            self.packed = pack_int8_dynamic(w)
        elif bits == 8:
            self.qweight, self.scales = quantize_int8(w)
        elif bits == 4:
            self.qweight, self.scales = quantize_int4(w)
        else:
            raise WeightQuantUnavailableError(f"no {bits}-bit weights (8 or 4)")

    def compute_dtype(self, rows: int) -> torch.dtype:
        """The dtype a product of `rows` rows runs in: bf16 on the packed kernels and the
        bf16 copy, else the float weights' own. A caller that feeds one product's output
        to the next (SwiGLU) keeps it in this dtype rather than casting back and forth."""
        if self.max_rows is not None and rows > self.max_rows:
            return self.large_weight.dtype
        return torch.float32 if self.packed is not None else torch.bfloat16

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [..., in] -> [..., out] in `out_dtype` (default: x's dtype)."""
        out_dtype = out_dtype or x.dtype
        flat = x.reshape(-1, self.in_features)
        if self.max_rows is not None and flat.shape[0] > self.max_rows:
            return self._large(x, out_dtype)
        if self.packed is not None:
            y = int8_dynamic_linear(flat.float(), self.packed, self.reduce_range)
        elif self.bits == 8:
            y = torch.ops.aten._weight_int8pack_mm(
                flat.to(torch.bfloat16), self.qweight, self.scales
            )
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat.to(torch.bfloat16), self.qweight, INT4_GROUP, self.scales
            )
        out: torch.Tensor = y.to(out_dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out.add_(self.bias)  # stays in out_dtype

    def _large(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        """The float product, in `large_weight`'s dtype, returned in `out_dtype`."""
        w = self.large_weight
        if w.dtype == x.dtype == out_dtype:
            return F.linear(x, w, self.bias)
        out: torch.Tensor = F.linear(x.to(w.dtype), w).to(out_dtype)
        return out if self.bias is None else out.add_(self.bias)  # stays in out_dtype


def native_bf16_matmul() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX-BF16).

    Read from the kernel's CPU flags (Linux); anywhere else, False: the model's own
    float weights then serve the large products, which is never slower.
    """
    return _cpu_flags() & {"avx512_bf16", "amx_bf16"} != set()


def int8_dot_products() -> bool:
    """Whether int8 x int8 products run on dot-product instructions here: VNNI (AVX-512
    or AVX) with torch's fbgemm engine. Without VNNI fbgemm's int8 GEMM would need its
    7-bit `reduce_range` to avoid overflow, and gains little."""
    return vnni() and _fbgemm_linear()


def vnni() -> bool:
    """Whether this CPU has VNNI (AVX-512 or AVX): int8 dot products into 32 bits."""
    return bool(_cpu_flags() & {"avx512_vnni", "avx_vnni"})


@cache
def _fbgemm_linear() -> bool:
    """Whether this torch has fbgemm's dynamic int8 linear (torch deprecated its quantized
    tensors; a release without them falls back to the weight-only kernels)."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return False
    try:
        return hasattr(torch.ops.quantized, "linear_dynamic")
    except (AttributeError, RuntimeError):
        return False


def pack_int8_dynamic(weight: torch.Tensor) -> torch.Tensor:
    """fbgemm's packed form of `weight` (fp32 [N, K]) as symmetric int8, one scale per row,
    with `RANGE_COLUMNS` zero inputs appended (they hold `int8_dynamic_linear`'s range)."""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    weight = F.pad(weight, (0, RANGE_COLUMNS))
    with warnings.catch_warnings():  # its deprecation is known: see `_fbgemm_linear`
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    packed: torch.Tensor = torch.ops.quantized.linear_prepack(q, None)
    return packed


def int8_dynamic_linear(
    x: torch.Tensor, packed: torch.Tensor, reduce_range: bool = True
) -> torch.Tensor:
    """x (fp32 [M, K]) @ W^T on fbgemm's int8 GEMM, x rounded to int8 with one scale per row.

    `reduce_range` rounds x to 7 bits instead: needed without VNNI, where fbgemm adds
    pairs of u8 x s8 products in 16 bits (AVX2's vpmaddubsw), which saturate on 8-bit
    inputs (measured on an AVX2 EPYC: errors up to 17% of a row's largest output with
    8 bits, 1% with 7).

    fbgemm quantizes its input with one range for the whole tensor (its min and max), so
    every row is made to have the same one: each row is divided by its own largest
    magnitude (and multiplied back after), and the `RANGE_COLUMNS` appended inputs (zero
    weights) hold 1 and -1. The range is then [-1, 1] whatever the other rows hold, and
    each row's result is bit for bit what it is alone: one row's outlier neither flattens
    the others (SmolLM2 with every linear so: perplexity 1.51x fp32's per tensor, 1.06x
    per row; its LM head alone per row: within 1%, see
    tests/engine/model/test_weight_quant_quality.py) nor, NaN or infinite (a broken
    adapter's row), shifts or breaks them: such a row is computed as zeros and comes out
    NaN, as its float product would.
    """
    rows, k = x.shape
    scale = x.abs().amax(dim=1, keepdim=True)  # NaN or inf where the row is not finite
    finite = bool(scale.isfinite().all())
    scale.clamp_(min=1e-12)  # an all-zero row stays zero
    grid = x.new_zeros(rows, k + RANGE_COLUMNS)
    torch.div(x, scale, out=grid[:, :k])
    grid[:, k], grid[:, k + 1] = 1.0, -1.0
    bad = None if finite else ~scale.isfinite()
    if bad is not None:
        grid[:, :k].masked_fill_(bad, 0.0)
    y: torch.Tensor = torch.ops.quantized.linear_dynamic(grid, packed, reduce_range)
    y.mul_(scale)
    return y if bad is None else y.masked_fill_(bad, float("nan"))


@cache
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (int8 [N, K], bf16 scales [N])."""
    scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scales.to(torch.bfloat16)


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of 32 inputs: (packed weight, bf16 [K/32, N, 2] scale/zero).

    Each group's grid is min + d*q (q in 0..15, d = (max - min) / 15), Q4_1's own; the
    kernel computes (q - 8) * scale + zero, so zero = min + 8d.
    """
    n, k = weight.shape
    if k % INT4_GROUP:
        raise WeightQuantUnavailableError(f"int4 needs inputs in groups of {INT4_GROUP}, not {k}")
    groups = weight.view(n, k // INT4_GROUP, INT4_GROUP)
    low = groups.amin(dim=-1)
    step = ((groups.amax(dim=-1) - low) / 15.0).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / step[..., None]).clamp(0, 15).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.view(n, k), 1)
    scale_zero = torch.stack((step, low + 8.0 * step), dim=-1).transpose(0, 1).contiguous()
    return packed, scale_zero.to(torch.bfloat16)


@dataclass(frozen=True)
class WeightQuantChoice:
    """The mode `weight_quant=auto` resolved to, and why (for logs and the summary)."""

    mode: WeightQuant
    reason: str  # "from Q4_1 GGUF", "from F16 GGUF", "Hugging Face folder", "on cuda", ...

    def describe(self) -> str:
        """For example "int4 (auto, from Q4_1 GGUF)"."""
        return f"{self.mode} (auto, {self.reason})"


def choose_weight_quant(path: str | Path, device: str | torch.device) -> WeightQuantChoice:
    """What `weight_quant=auto` runs for the model at `path` (a .gguf or a folder) on
    `device`: on the CPU, a quantized GGUF's own fast path (see GGUF_AUTO_QUANT: the type
    that stores most of its decoder's weights decides); "none" for a float checkpoint (a
    float GGUF, any Hugging Face folder, whose quantized formats run their own kernels),
    a mixture-of-experts model (the quantized linears are dense only) and any device but
    the CPU (the kernels are the CPU's). Reads only the GGUF's header."""
    device_type = torch.device(device).type
    if device_type != "cpu":
        return WeightQuantChoice("none", f"on {device_type}")
    path = Path(path)
    if not (path.is_file() and path.suffix == ".gguf"):
        return WeightQuantChoice("none", "Hugging Face folder")
    stored = gguf_decoder_storage(path)
    if any("_exps." in name for name in stored.names):
        return WeightQuantChoice("none", "mixture of experts")
    main = max(stored.weights, key=stored.weights.__getitem__, default="F32")
    mode = GGUF_AUTO_QUANT.get(main, "none")
    return WeightQuantChoice(mode, f"from {main} GGUF")


@dataclass(frozen=True)
class GGUFStorage:
    """A GGUF's decoder matrices (tensors "blk.*" of 2 or more dimensions): their names,
    and how many weights each tensor type stores."""

    names: tuple[str, ...]
    weights: dict[str, int]


_GGUF_SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_decoder_storage(path: str | Path) -> GGUFStorage:
    """The decoder's storage types from the GGUF header alone (v2/v3, little-endian).

    Why not gguf.GGUFReader: it parses every metadata value, the tokenizer's ~100k
    strings included, which takes ~3 s for SmolLM2; this skips them (tens of ms)."""
    from gguf import GGMLQuantizationType

    with open(path, "rb") as f:
        data = f.read(1 << 16)
        pos = 0

        def take(n: int) -> bytes:
            nonlocal data, pos
            while len(data) - pos < n:  # the header spans more than was read
                more = f.read(max(1 << 20, n))
                if not more:
                    raise ValueError(f"{path}: the GGUF header is truncated")
                data, pos = data[pos:] + more, 0
            pos += n
            return data[pos - n : pos]

        def u32() -> int:
            return int(struct.unpack("<I", take(4))[0])

        def u64() -> int:
            return int(struct.unpack("<Q", take(8))[0])

        def skip_value(kind: int) -> None:
            if kind == _GGUF_STRING:
                take(u64())
            elif kind == _GGUF_ARRAY:
                item, count = u32(), u64()
                if item in _GGUF_SCALARS:
                    take(_GGUF_SCALARS[item] * count)
                else:
                    for _ in range(count):
                        skip_value(item)
            elif kind in _GGUF_SCALARS:
                take(_GGUF_SCALARS[kind])
            else:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")

        if take(4) != b"GGUF" or u32() not in (2, 3):
            raise ValueError(f"{path} is not a little-endian GGUF v2/v3 file")
        tensors, fields = u64(), u64()
        for _ in range(fields):
            take(u64())  # the key
            skip_value(u32())
        names: list[str] = []
        weights: dict[str, int] = {}
        for _ in range(tensors):
            name = take(u64()).decode()
            dims = [u64() for _ in range(u32())]
            kind = GGMLQuantizationType(u32()).name
            u64()  # the data offset
            if name.startswith("blk.") and len(dims) >= 2:
                names.append(name)
                weights[kind] = weights.get(kind, 0) + math.prod(dims)
    return GGUFStorage(tuple(names), weights)


def resolve_weight_quant(
    setting: str, path: str | Path, device: str | torch.device
) -> tuple[WeightQuant, WeightQuantChoice | None]:
    """The mode `setting` runs for the model at `path` on `device`, and the choice when
    `setting` is "auto" (None otherwise); WeightQuantUnavailableError for a bad setting
    or a mode that cannot run on `device`."""
    if setting not in WEIGHT_QUANT_SETTINGS:
        raise WeightQuantUnavailableError(
            f"weight_quant must be auto, none, int8 or int4, not {setting!r}"
        )
    if setting == "auto":
        choice = choose_weight_quant(path, device)
        return check_weight_quant(choice.mode, torch.device(device)), choice
    return check_weight_quant(setting, torch.device(device)), None


def check_weight_quant(mode: str, device: torch.device) -> WeightQuant:
    """`mode` when it can run on `device`; WeightQuantUnavailableError otherwise."""
    if mode not in WEIGHT_QUANT_MODES:
        raise WeightQuantUnavailableError(f"weight_quant must be none, int8 or int4, not {mode!r}")
    if mode != "none" and device.type != "cpu":
        raise WeightQuantUnavailableError(
            f"weight_quant {mode!r} runs on the CPU only, not on {device.type!r}"
        )
    return mode
