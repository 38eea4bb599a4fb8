"""Llama-family decoder (Llama, SmolLM, Qwen2) over a flat batch of tokens.

The batch has no batch dimension and no padding: `input_ids` and `positions` are
[T] and every sequence's new tokens sit end to end. Attention goes through the
per-step `ForwardContext`, which owns the paged KV cache and its metadata.
Parameter names follow Hugging Face's, so a safetensors state dict loads as is.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.forward_context import ForwardContext
from engine.model.rope import RotaryEmbedding, rope_scaling_dict

# Checkpoint entries that are derived state, not weights.
_IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like the reference implementation."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalises the last dimension and scales it by the learned weight."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LlamaAttention(nn.Module):
    """Grouped-query attention; K/V storage and the attention math live in the backend."""

    def __init__(self, arch: ModelArchitecture, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = arch.num_heads
        self.num_kv_heads = arch.num_kv_heads
        self.head_dim = arch.head_dim
        self.scale = arch.head_dim**-0.5
        q_size, kv_size = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
        bias = arch.attention_bias
        self.q_proj = nn.Linear(arch.hidden_size, q_size, bias=bias)
        self.k_proj = nn.Linear(arch.hidden_size, kv_size, bias=bias)
        self.v_proj = nn.Linear(arch.hidden_size, kv_size, bias=bias)
        # Llama's attention_bias covers o_proj too; Qwen2 biases only q, k and v.
        self.o_proj = nn.Linear(
            q_size, arch.hidden_size, bias=bias and arch.architecture != "qwen2"
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        kv_cache = ctx.kv_caches[self.layer_idx]
        out = ctx.backend.forward(q, k, v, kv_cache, ctx.meta, self.scale)
        projected: torch.Tensor = self.o_proj(out.reshape(t, self.num_heads * self.head_dim))
        return projected


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        out: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, arch: ModelArchitecture, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch, layer_idx)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = LlamaMLP(arch.hidden_size, arch.intermediate_size)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        h: torch.Tensor = x + self.self_attn(self.input_layernorm(x), positions, rotary, ctx)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h))
        return out


class LlamaModel(nn.Module):
    """Embeddings, the decoder stack and the final norm (HF's `model.` prefix)."""

    def __init__(self, arch: ModelArchitecture) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, i) for i in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The whole decoder plus its LM head, run on a flat batch.

    Build it with `LlamaForCausalLM.empty(...)` and fill it with `load_weights`; the
    plain constructor initialises random weights (used by tests).
    """

    def __init__(
        self, arch: ModelArchitecture, rope_freq_factors: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.arch = arch
        self.model = LlamaModel(arch)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(
            arch.head_dim,
            arch.max_position_embeddings,
            arch.rope_theta,
            rope_scaling_dict(arch.rope_scaling),
            rope_freq_factors,
        )
        self.tie_weights()

    @classmethod
    def empty(
        cls,
        arch: ModelArchitecture,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        rope_freq_factors: torch.Tensor | None = None,
    ) -> LlamaForCausalLM:
        """Allocates an uninitialised model (no random init cost) ready for `load_weights`."""
        with torch.device("meta"):
            model = cls(arch, rope_freq_factors)
        model = model.to(dtype=dtype).to_empty(device=device)
        model.tie_weights()  # to_empty may replace the shared Parameter
        model.rotary.rebuild(device)
        model.requires_grad_(False)
        return model.eval()

    def tie_weights(self) -> None:
        """Shares the embedding matrix with the LM head when the model ties them."""
        if self.arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        """input_ids, positions [T] -> final hidden states [T, hidden] (after the norm)."""
        x: torch.Tensor = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions, self.rotary, ctx)
        hidden: torch.Tensor = self.model.norm(x)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        logits: torch.Tensor = self.lm_head(hidden)
        return logits.float()

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies HF-named tensors into the parameters; every parameter must be given once.

        Raises UnsupportedModelError on an unknown name, a shape mismatch or a
        missing weight, so a wrong checkpoint never runs half-loaded.
        """
        params = dict(self.named_parameters())
        missing = set(params)
        for name, tensor in weights:
            if name.endswith(_IGNORED_WEIGHTS):
                continue
            if name == "lm_head.weight" and self.arch.tie_word_embeddings:
                continue  # some tied checkpoints store the head anyway
            param = params.get(name)
            if param is None:
                raise UnsupportedModelError(f"unexpected weight {name!r} in checkpoint")
            if tuple(param.shape) != tuple(tensor.shape):
                raise UnsupportedModelError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(param.shape)}"
                )
            param.copy_(tensor)
            missing.discard(name)
        if missing:
            raise UnsupportedModelError(f"checkpoint lacks weights: {sorted(missing)[:8]}")
