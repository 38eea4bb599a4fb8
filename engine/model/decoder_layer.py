"""One decoder layer: attention and a feed-forward (dense or mixture of experts), each
behind an RMSNorm and added to the residual stream."""

from __future__ import annotations

import torch
from torch import nn

from engine.config import ModelArchitecture
from engine.model.attention_layer import LlamaAttention
from engine.model.forward_context import ForwardContext
from engine.model.fused import FusedOps
from engine.model.mlp import LlamaMLP
from engine.model.moe import MoEBlock
from engine.model.norm import RMSNorm
from engine.model.rope import RotaryEmbedding


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h)).

    With `sandwich_norms` (Gemma) the outputs are normed too, and the norm names
    follow Gemma's: h = x + post_attention_norm(attn(input_norm(x))), then
    h + post_feedforward_norm(mlp(pre_feedforward_norm(h))).
    """

    def __init__(self, arch: ModelArchitecture, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch, layer_idx)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp: LlamaMLP | MoEBlock = (
            MoEBlock(arch, layer_idx)
            if arch.is_moe_layer(layer_idx)
            else LlamaMLP(arch.hidden_size, arch.intermediate_size, layer_idx, arch.mlp_activation)
        )
        self.sandwich = arch.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        attn = self.self_attn(self.input_layernorm(x), positions, rotary, ctx)
        if self.sandwich:
            h = x + self.post_attention_layernorm(attn)
            mlp = self.mlp(self.pre_feedforward_layernorm(h), None, ctx.lora)
            out: torch.Tensor = h + self.post_feedforward_layernorm(mlp)
            return out
        h = x + attn
        out = h + self.mlp(self.post_attention_layernorm(h), None, ctx.lora)
        return out

    def forward_fused(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
        fused: FusedOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) -> (mlp output, residual): the layer's output is their sum.

        residual None (the first layer): x is the residual stream itself.
        """
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        normed, residual = fused.add_rms_norm(x, residual, norm1.weight, norm1.eps)
        attn = self.self_attn(normed, positions, rotary, ctx, fused)
        normed, residual = fused.add_rms_norm(attn, residual, norm2.weight, norm2.eps)
        return self.mlp(normed, fused, ctx.lora), residual
