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
from torch import nn

from engine.config import ModelArchitecture
from engine.errors import UnsupportedModelError
from engine.model.cpu_linear import PackedLinear, float_linear, packed_linear
from engine.model.decoder_layer import LlamaDecoderLayer
from engine.model.forward_context import ForwardContext
from engine.model.fused import FusedOps
from engine.model.norm import RMSNorm
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
        # Gemma 3: the window layers' rotary has a base of its own (and no scaling).
        self.local_rotary = (
            None
            if arch.local_rope_theta is None
            else RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.local_rope_theta)
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
        if model.local_rotary is not None:
            model.local_rotary.rebuild(device)
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
        if self.arch.embedding_multiplier != 1.0:  # Gemma: in the embeddings' dtype, as HF
            x = x * torch.tensor(self.arch.embedding_multiplier, dtype=x.dtype)
        fused = self.fused_ops
        # The fused kernels add each norm's input to the residual; sandwich norms do not.
        if fused is not None and not self.arch.sandwich_norms:
            return self._forward_fused(x, positions, ctx, fused)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, self.rotary_of(i), ctx)
        hidden: torch.Tensor = self.model.norm(x)
        return hidden

    def rotary_of(self, layer: int) -> RotaryEmbedding:
        """The rotary table of `layer`: a window layer's own base where the model has one."""
        if self.local_rotary is not None and self.arch.layer_window(layer) is not None:
            return self.local_rotary
        return self.rotary

    def _forward_fused(
        self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext, fused: FusedOps
    ) -> torch.Tensor:
        """The decoder stack on the fused kernels (same result as the torch path)."""
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.model.layers):
            assert isinstance(layer, LlamaDecoderLayer)
            rotary = self.rotary_of(i)
            x, residual = layer.forward_fused(x, residual, positions, rotary, ctx, fused)
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
        cap = self.arch.final_logit_softcap
        if cap is not None:  # Gemma 2: tanh keeps every logit within (-cap, cap)
            return torch.tanh(logits.float() / cap) * cap
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
