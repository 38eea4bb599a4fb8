"""A decoder layer's attention: q/k/v projections, rotary, the backend, o_proj."""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelArchitecture
from engine.model.cpu_linear import PackedLinear, float_linear, packed_linear
from engine.model.forward_context import ForwardContext
from engine.model.fused import FusedOps
from engine.model.norm import RMSNorm
from engine.model.projections import pack_linears
from engine.model.quant import QuantizedLinear, QuantPlan
from engine.model.rope import RotaryEmbedding


class LlamaAttention(nn.Module):
    """Grouped-query attention; K/V storage and the attention math live in the backend."""

    def __init__(self, arch: ModelArchitecture, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        self.scale = arch.attention_scale or arch.head_dim**-0.5
        self.window = arch.layer_window(layer_idx)
        self.softcap = arch.attention_softcap  # Gemma 2: every layer caps its scores
        q_size, kv_size = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        bias = arch.attention_bias
        self.q_proj = nn.Linear(arch.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(arch.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(arch.hidden_size, kv_size, bias=bias)
        self.o_proj = nn.Linear(q_size, arch.hidden_size, bias=arch.output_bias)
        # Qwen3: an RMSNorm over each head of q and of k, before rotary.
        self.q_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(arch.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self._sizes = [q_size, kv_size, kv_size]
        # Packed copies are non-persistent buffers: `.to()` moves them, state dicts skip them.
        self.qkv_weight: torch.Tensor | None
        self.qkv_bias: torch.Tensor | None
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)
        # Set by `LlamaForCausalLM.quantize_weights`: the packed qkv and o_proj products.
        self.qkv_quant: QuantizedLinear | None = None
        self.o_quant: QuantizedLinear | None = None
        # Set by `LlamaForCausalLM.use_cpu_packed_linears`: the float weights packed.
        self.qkv_packed: PackedLinear | None = None
        self.o_packed: PackedLinear | None = None

    def fuse(self) -> None:
        """Packs q/k/v into one matrix so one GEMM computes all three (see `pack_linears`)."""
        self.qkv_weight, self.qkv_bias = pack_linears(self.q_proj, self.k_proj, self.v_proj)

    def quantize(self, plan: QuantPlan | None) -> None:
        """Runs qkv and o_proj on quantized weights from now on; None: the float weights."""
        if plan is None or self.qkv_weight is None:
            self.qkv_quant = self.o_quant = None
            return
        self.qkv_quant = plan.linear(self.qkv_weight, self.qkv_bias)
        self.o_quant = plan.linear(self.o_proj.weight, self.o_proj.bias)

    def pack_for_cpu(self, on: bool) -> None:
        """Runs qkv and o_proj through oneDNN-packed weights where that applies
        (engine/model/cpu_linear.py); False: the plain float weights."""
        self.qkv_packed = self.o_packed = None
        if on and self.qkv_weight is not None:
            self.qkv_packed = packed_linear(self.qkv_weight, self.qkv_bias)
            self.o_packed = packed_linear(self.o_proj.weight, self.o_proj.bias)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
        fused: FusedOps | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; with `fused`, rotary runs as a triton kernel."""
        t = x.shape[0]
        lora = ctx.lora
        if self.qkv_weight is not None:
            qkv = (
                self.qkv_quant(x)
                if self.qkv_quant is not None
                else float_linear(x, self.qkv_weight, self.qkv_bias, self.qkv_packed)
            )
            if lora is not None:
                lora.add(self.layer_idx, "qkv", x, qkv)
            q2, k2, v2 = torch.split(qkv, self._sizes, -1)
        elif lora is not None:
            qkv = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), -1)
            q2, k2, v2 = torch.split(lora.add(self.layer_idx, "qkv", x, qkv), self._sizes, -1)
        else:
            q2, k2, v2 = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q2.view(t, self.num_heads, self.head_dim)
        k = k2.view(t, self.num_kv_heads, self.head_dim)
        v = v2.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if fused is None:
            q, k = rotary(positions, q, k)
        else:
            # In place on the views into this step's fresh projection output (the
            # kernel takes the row and head strides, so the split needs no copy). With
            # partial rotary it turns only the first rotary_dim dims (a view again).
            r = rotary.rotary_dim
            fused.rotary_(q[..., :r], k[..., :r], positions, rotary.cos_cache, rotary.sin_cache)
        kv_cache = ctx.kv_caches[self.layer_idx]
        out = ctx.backend.forward(
            q, k, v, kv_cache, ctx.meta, self.scale, self.window, self.softcap
        )
        flat = out.reshape(t, self.num_heads * self.head_dim)
        projected: torch.Tensor = (
            self.o_quant(flat)
            if self.o_quant is not None
            else float_linear(flat, self.o_proj.weight, self.o_proj.bias, self.o_packed)
        )
        if lora is not None:
            lora.add(self.layer_idx, "o", flat, projected)
        return projected
