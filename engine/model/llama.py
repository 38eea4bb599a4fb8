"""The decoder every family runs on (engine/model/registry.py), over a flat batch.

The batch has no batch dimension and no padding: `input_ids` and `positions` are
[T] and every sequence's new tokens sit end to end. Attention goes through the
per-step `ForwardContext`, which owns the paged KV cache and its metadata.
Parameter names follow Hugging Face's, so a safetensors state dict loads as is.

Two code paths compute the same function: the torch ops (the reference, the CPU
default) and, after `use_fused_ops(load_fused_ops())`, triton kernels for the
elementwise work (engine/model/fused.py). The fused path carries the residual
stream beside the hidden state, so each RMSNorm also does the add before it:

    torch:  h = x + attn(norm1(x));            out = h + mlp(norm2(h))
    fused:  n, r = add_norm1(x, r);  a = attn(n);  n, r = add_norm2(a, r);  x = mlp(n)
            (r starts as the embeddings; the final norm adds the last layer's x)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.lora.batch import LoraBatch
from engine.model.cpu_linear import PackedLinear, float_linear, packed_linear
from engine.model.forward_context import ForwardContext
from engine.model.fused import FusedOps
from engine.model.moe import MoEBlock
from engine.model.quant import (
    QUANT_MAX_ROWS,
    QUANT_MAX_ROWS_BF16,
    QuantizedLinear,
    QuantPlan,
    WeightQuant,
    int8_dot_products,
    native_bf16_matmul,
)
from engine.model.rope import RotaryEmbedding, rope_scaling_dict

# Checkpoint entries that are derived state, not weights.
_IGNORED_WEIGHTS = ("rotary_emb.inv_freq",)


def pack_linears(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenates the weights (and biases) of Linears that read the same input.

    Each Linear's parameters become views into the packed tensors, so the memory is
    not doubled and the HF-named parameters still show the loaded values. Fewer,
    wider GEMMs run markedly faster on the CPU, and launch less on the GPU.
    """
    weight = torch.cat([lin.weight.detach() for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = (
        torch.cat([b.detach() for b in biases if b is not None])
        if all(b is not None for b in biases)
        else None
    )
    row = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[row : row + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[row : row + rows], requires_grad=False)
        row += rows
    return weight, bias


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 like the reference implementation."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalises the last dimension and scales it by the learned weight."""
        if x.dtype == self.weight.dtype == torch.float32:
            # torch's own kernel: one op instead of six, and bit for bit the same here.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
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
        self.window = arch.layer_window(layer_idx)
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
            # kernel takes the row and head strides, so the split needs no copy).
            fused.rotary_(q, k, positions, rotary.cos_cache, rotary.sin_cache)
        kv_cache = ctx.kv_caches[self.layer_idx]
        out = ctx.backend.forward(q, k, v, kv_cache, ctx.meta, self.scale, self.window)
        flat = out.reshape(t, self.num_heads * self.head_dim)
        projected: torch.Tensor = (
            self.o_quant(flat)
            if self.o_quant is not None
            else float_linear(flat, self.o_proj.weight, self.o_proj.bias, self.o_packed)
        )
        if lora is not None:
            lora.add(self.layer_idx, "o", flat, projected)
        return projected


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int, layer_idx: int = 0) -> None:
        super().__init__()
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
        if fused is not None:
            return self._down(fused.silu_and_mul(self._gate_up(x)))
        if self.gate_up_quant is not None and self.down_quant is not None:
            # Between the two products the activations stay in their compute dtype
            # (bf16): a prefill's [T, 2I] casts cost a fifth of its MLP otherwise.
            mid = self.gate_up_quant.compute_dtype(x.shape[0])
            gate, up = torch.split(self.gate_up_quant(x, mid), self._intermediate, -1)
            return self.down_quant(F.silu(gate) * up, x.dtype)
        if self.gate_up_weight is not None:
            gate, up = torch.split(self._gate_up(x), self._intermediate, -1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self._down(F.silu(gate) * up)

    def _forward_lora(
        self, x: torch.Tensor, fused: FusedOps | None, lora: LoraBatch
    ) -> torch.Tensor:
        gate_up = self._gate_up(x)
        lora.add(self.layer_idx, "gate_up", x, gate_up)
        if fused is not None:
            act = fused.silu_and_mul(gate_up)
        else:
            gate, up = torch.split(gate_up, self._intermediate, -1)
            act = F.silu(gate) * up
        return lora.add(self.layer_idx, "down", act, self._down(act))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, arch: ModelArchitecture, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.self_attn = LlamaAttention(arch, layer_idx)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp: LlamaMLP | MoEBlock = (
            MoEBlock(arch, layer_idx)
            if arch.is_moe_layer(layer_idx)
            else LlamaMLP(arch.hidden_size, arch.intermediate_size, layer_idx)
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        h: torch.Tensor = x + self.self_attn(self.input_layernorm(x), positions, rotary, ctx)
        out: torch.Tensor = h + self.mlp(self.post_attention_layernorm(h), None, ctx.lora)
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
        self.fused_ops: FusedOps | None = None
        self.weight_quant: WeightQuant = "none"
        self._quant_plan: QuantPlan | None = None  # how `weight_quant` runs; None: "none"
        self.lm_head_quant: QuantizedLinear | None = None
        self.cpu_packed_linears = False  # see `use_cpu_packed_linears`
        self.lm_head_packed: PackedLinear | None = None

    def use_fused_ops(self, fused: FusedOps | None) -> None:
        """Runs the forward pass with these triton kernels from now on; None: torch ops.

        The engine sets it from ModelConfig.fused_ops (see engine/model/fused.py).
        """
        self.fused_ops = fused

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
        fused = self.fused_ops
        if fused is not None:
            return self._forward_fused(x, positions, ctx, fused)
        for layer in self.model.layers:
            x = layer(x, positions, self.rotary, ctx)
        hidden: torch.Tensor = self.model.norm(x)
        return hidden

    def _forward_fused(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext, fused: FusedOps
    ) -> torch.Tensor:
        """The decoder stack on the fused kernels (same result as the torch path)."""
        residual: torch.Tensor | None = None
        for layer in self.model.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            x, residual = layer.forward_fused(x, residual, positions, self.rotary, ctx, fused)
        norm = self.model.norm
        hidden, _ = fused.add_rms_norm(x, residual, norm.weight, norm.eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        logits: torch.Tensor = (
            self.lm_head_quant(hidden)
            if self.lm_head_quant is not None
            else float_linear(hidden, self.lm_head.weight, None, self.lm_head_packed)
        )
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
        self.fuse()

    def fuse(self) -> None:
        """Packs each layer's q/k/v and gate/up projections (done once weights are final)."""
        for layer in self.model.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layer.self_attn.fuse()
            layer.mlp.fuse()
        self.use_cpu_packed_linears(self.cpu_packed_linears)  # new weights: pack them again
        plan = self._quant_plan
        if plan is not None:  # new weights: quantize them again
            mode, self.weight_quant, self._quant_plan = self.weight_quant, "none", None
            self.quantize_weights(
                mode, plan.max_rows, plan.large_dtype is not None, plan.head_int8_activations
            )

    @torch.no_grad()
    def use_cpu_packed_linears(self, on: bool) -> None:
        """Runs the float linears of the layers and the LM head through weights packed
        for oneDNN from now on, where they apply (float32 on the CPU, weights large
        enough; see engine/model/cpu_linear.py); False: the plain float weights. The
        packed copies take as much memory again as the weights they copy. Quantized
        products (`quantize_weights`) are unaffected."""
        self.cpu_packed_linears = on
        for layer in self.model.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layer.self_attn.pack_for_cpu(on)
            layer.mlp.pack_for_cpu(on)
        self.lm_head_packed = packed_linear(self.lm_head.weight) if on else None

    @torch.no_grad()
    def quantize_weights(
        self,
        mode: WeightQuant,
        max_rows: int | None | Literal["auto"] = "auto",
        prefill_bf16: bool | None = None,
        head_int8_activations: bool | None = None,
    ) -> None:
        """Runs the linears on weight-only int8/int4 kernels ("none": the float weights).

        See engine/model/quant.py for the formats; the LM head is int8 in both modes, and
        with `head_int8_activations` (None: where the CPU has int8 dot products, see
        `int8_dot_products`) its small products round their inputs to int8 per row too:
        on SmolLM2 a quarter of a batch-8 decode step was its weight-only product.
        Products of more than `max_rows` rows (prefill) run on float weights, which are
        faster there: a bf16 copy when `prefill_bf16` (None: where the CPU multiplies
        bf16 natively, see `native_bf16_matmul`), else the model's own. `max_rows`
        "auto" is where each is faster (QUANT_MAX_ROWS_BF16 with the bf16 copy, else
        QUANT_MAX_ROWS); None quantizes every product (the quality test's worst case).
        Idempotent; the float weights are kept, so any mode can follow any other.
        Raises WeightQuantUnavailableError off the CPU.
        """
        if prefill_bf16 is None:
            prefill_bf16 = native_bf16_matmul()
        large = torch.bfloat16 if prefill_bf16 and mode != "none" else None
        if max_rows == "auto":
            max_rows = QUANT_MAX_ROWS if large is None else QUANT_MAX_ROWS_BF16
        bits = {"none": None, "int8": 8, "int4": 4}[mode]
        if head_int8_activations is None:
            head_int8_activations = int8_dot_products()
        plan = None if bits is None else QuantPlan(bits, max_rows, large, head_int8_activations)
        if (mode, plan) == (self.weight_quant, self._quant_plan):
            return
        for layer in self.model.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layer.self_attn.quantize(plan)
            layer.mlp.quantize(plan)
        self.lm_head_quant = (
            None
            if plan is None
            else plan.linear(
                self.lm_head.weight, bits=8, int8_activations=plan.head_int8_activations
            )
        )
        self.weight_quant, self._quant_plan = mode, plan
