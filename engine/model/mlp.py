"""A dense decoder layer's feed-forward: down(act(gate(x)) * up(x))."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from engine.lora.batch import LoraBatch
from engine.model.cpu_linear import PackedLinear, float_linear, packed_linear
from engine.model.fused import FusedOps
from engine.model.projections import pack_linears
from engine.model.quant import QuantizedLinear, QuantPlan


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        layer_idx: int = 0,
        activation: Literal["silu", "gelu_tanh"] = "silu",
    ) -> None:
        super().__init__()
        # SwiGLU (silu) or Gemma's GeGLU (tanh-approximated gelu).
        self.act: Callable[[torch.Tensor], torch.Tensor] = (
            F.silu if activation == "silu" else partial(F.gelu, approximate="tanh")
        )
        self._silu = activation == "silu"
        self.layer_idx = layer_idx
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self._intermediate = intermediate
        self.gate_up_weight: torch.Tensor | None
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.gate_up_quant: QuantizedLinear | None = None
        self.down_quant: QuantizedLinear | None = None
        self.gate_up_packed: PackedLinear | None = None
        self.down_packed: PackedLinear | None = None

    def fuse(self) -> None:
        """Packs gate and up into one matrix so one GEMM computes both."""
        self.gate_up_weight = pack_linears(self.gate_proj, self.up_proj)[0]

    def quantize(self, plan: QuantPlan | None) -> None:
        """Runs gate/up and down on quantized weights from now on; None: the float weights."""
        if plan is None or self.gate_up_weight is None:
            self.gate_up_quant = self.down_quant = None
            return
        self.gate_up_quant = plan.linear(self.gate_up_weight)
        self.down_quant = plan.linear(self.down_proj.weight)

    def pack_for_cpu(self, on: bool) -> None:
        """Runs gate/up and down through oneDNN-packed weights where that applies."""
        self.gate_up_packed = self.down_packed = None
        if on and self.gate_up_weight is not None:
            self.gate_up_packed = packed_linear(self.gate_up_weight)
            self.down_packed = packed_linear(self.down_proj.weight)

    def _gate_up(self, x: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, 2I]: gate, then up."""
        if self.gate_up_quant is not None:
            return self.gate_up_quant(x)
        if self.gate_up_weight is not None:
            return float_linear(x, self.gate_up_weight, None, self.gate_up_packed)
        return torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1)

    def _down(self, act: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = (
            self.down_quant(act)
            if self.down_quant is not None
            else float_linear(act, self.down_proj.weight, None, self.down_packed)
        )
        return out

    def forward(
        self, x: torch.Tensor, fused: FusedOps | None = None, lora: LoraBatch | None = None
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; with `fused`, SiLU-and-mul is one triton kernel.

        `lora`: the step's adapter rows, added to gate/up (packed) and to down.
        """
        if lora is not None:
            return self._forward_lora(x, fused, lora)
        if fused is not None and self._silu:
            return self._down(fused.silu_and_mul(self._gate_up(x)))
        if self.gate_up_quant is not None and self.down_quant is not None:
            # Between the two products the activations stay in their compute dtype
            # (bf16): a prefill's [T, 2I] casts cost a fifth of its MLP otherwise.
            mid = self.gate_up_quant.compute_dtype(x.shape[0])
            gate, up = torch.split(self.gate_up_quant(x, mid), self._intermediate, -1)
            return self.down_quant(self.act(gate) * up, x.dtype)
        if self.gate_up_weight is not None:
            gate, up = torch.split(self._gate_up(x), self._intermediate, -1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self._down(self.act(gate) * up)

    def _forward_lora(
        self, x: torch.Tensor, fused: FusedOps | None, lora: LoraBatch
    ) -> torch.Tensor:
        gate_up = self._gate_up(x)
        lora.add(self.layer_idx, "gate_up", x, gate_up)
        if fused is not None and self._silu:
            act = fused.silu_and_mul(gate_up)
        else:
            gate, up = torch.split(gate_up, self._intermediate, -1)
            act = self.act(gate) * up
        return lora.add(self.layer_idx, "down", act, self._down(act))
