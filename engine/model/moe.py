"""Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): a router picks each token's
top-k experts, each a SwiGLU MLP, and their outputs are summed by routing weight.

    probs = softmax(x @ gate.T)            (float32)
    w, ids = top_k(probs)                  (renormalised to sum 1 when the family does)
    out[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])),  e = ids[t, j]

The experts' weights are stacked once loaded: `w13` [E, 2I, H] (gate rows, then up)
and `w2` [E, H, I]. On the CPU `moe_experts_ref` runs them grouped by expert (one
gather, two GEMMs and a scatter-add per expert that has tokens); on CUDA the triton
grouped GEMM in engine/kernels/fused_moe.py does the same in two launches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.cpu_linear import PackedLinear, float_linear, packed_linear

if TYPE_CHECKING:  # the GPU image's kernel tests import this module without them
    from engine.lora.batch import LoraBatch
    from engine.model.fused import FusedOps
    from engine.model.quant import QuantPlan


def route(
    x: torch.Tensor, gate: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in x's dtype, expert ids [T, k] int64) of each token's top-k."""
    probs = F.softmax(F.linear(x, gate).float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(x.dtype), ids


def moe_experts_ref(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    packed: tuple[list[PackedLinear | None], list[PackedLinear | None]] | None = None,
) -> torch.Tensor:
    """The experts' weighted sum for each token, grouped by expert (the reference).

    x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/topk_ids [T, k] -> [T, H].
    `packed`: each expert's w13 and w2 packed for oneDNN (engine/model/cpu_linear.py).
    """
    t, k = topk_ids.shape
    inter = w2.shape[-1]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    tokens = order // k
    weights = topk_weights.reshape(-1)[order]
    out = torch.zeros_like(x)
    start = 0
    for expert, count in enumerate(counts):
        if not count:
            continue
        rows = tokens[start : start + count]
        first, second = (None, None) if packed is None else (packed[0][expert], packed[1][expert])
        gate_up = float_linear(x.index_select(0, rows), w13[expert], None, first)
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = float_linear(act, w2[expert], None, second) * weights[start : start + count, None]
        out.index_add_(0, rows, y)
        start += count
    return out


class ExpertMLP(nn.Module):
    """One expert's SwiGLU weights under Hugging Face's names (they load as they are)."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)


class MoEBlock(nn.Module):
    """The sparse feed-forward of one layer: `gate` (the router) and `experts`."""

    def __init__(self, arch: ModelArchitecture, layer_idx: int = 0) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.top_k = arch.num_experts_per_tok
        self.renormalize = arch.moe_renormalize
        self.gate = nn.Linear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = nn.ModuleList(
            ExpertMLP(arch.hidden_size, arch.moe_intermediate_size) for _ in range(arch.num_experts)
        )
        self.w13: torch.Tensor | None
        self.w2: torch.Tensor | None
        self.register_buffer("w13", None, persistent=False)
        self.register_buffer("w2", None, persistent=False)
        # Set by `pack_for_cpu`: each expert's w13 and w2 packed for oneDNN.
        self.packed: tuple[list[PackedLinear | None], list[PackedLinear | None]] | None = None

    def fuse(self) -> None:
        """Stacks the experts' weights into w13 and w2; each expert's parameters become
        views into them, so memory is not doubled."""
        experts = [e for e in self.experts if isinstance(e, ExpertMLP)]
        self.w13 = torch.stack(
            [torch.cat((e.gate_proj.weight.detach(), e.up_proj.weight.detach())) for e in experts]
        )
        self.w2 = torch.stack([e.down_proj.weight.detach() for e in experts])
        inter = self.w2.shape[-1]
        for i, e in enumerate(experts):
            e.gate_proj.weight = nn.Parameter(self.w13[i, :inter], requires_grad=False)
            e.up_proj.weight = nn.Parameter(self.w13[i, inter:], requires_grad=False)
            e.down_proj.weight = nn.Parameter(self.w2[i], requires_grad=False)

    def quantize(self, plan: QuantPlan | None) -> None:
        """Weight-only quantization covers dense linears only; refused for experts."""
        if plan is not None:
            raise UnsupportedModelError(
                "weight_quant is not supported on mixture-of-experts models; use none"
            )

    def pack_for_cpu(self, on: bool) -> None:
        """Runs each expert's products through oneDNN-packed weights where that applies
        (float32 on the CPU, large enough); the copies double the experts' memory."""
        self.packed = None
        if on and self.w13 is not None and self.w2 is not None:
            self.packed = (
                [packed_linear(w) for w in self.w13],
                [packed_linear(w) for w in self.w2],
            )

    def forward(
        self, x: torch.Tensor, fused: FusedOps | None = None, lora: LoraBatch | None = None
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        if self.w13 is None or self.w2 is None:
            self.fuse()
        assert self.w13 is not None and self.w2 is not None
        weights, ids = route(x, self.gate.weight, self.top_k, self.renormalize)
        if x.is_cuda:
            from engine.kernels.fused_moe import fused_moe

            return fused_moe(x, self.w13, self.w2, weights, ids)
        return moe_experts_ref(x, self.w13, self.w2, weights, ids, self.packed)
