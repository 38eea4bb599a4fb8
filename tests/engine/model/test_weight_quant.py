"""Weight-only int8/int4 linears: exact on weights already on their grid, switchable."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import quant
from engine.model.decoder_layer import LlamaDecoderLayer
from engine.model.llama import LlamaForCausalLM
from engine.model.mlp import LlamaMLP
from engine.model.quant import (
    INT4_GROUP,
    QuantizedLinear,
    QuantPlan,
    WeightQuantUnavailableError,
    check_weight_quant,
)
from tests.utils.model_step import TINY_ARCH, ModelStepper

ARCH = TINY_ARCH


def q4_grid_weight(n: int, k: int) -> torch.Tensor:
    """A weight whose every group of 32 is min + d*q with q spanning 0..15 (Q4_1's grid);
    d and min are bf16 values, so the packed form holds them exactly."""
    torch.manual_seed(0)
    q = torch.randint(0, 16, (n, k // INT4_GROUP, INT4_GROUP))
    q[..., 0], q[..., 1] = 0, 15  # the grid's ends are attained, as in Q4_1
    d = (torch.rand(n, k // INT4_GROUP, 1) * 0.01 + 0.001).to(torch.bfloat16).float()
    low = (torch.randn(n, k // INT4_GROUP, 1) * 0.05).to(torch.bfloat16).float()
    return (low + d * q).view(n, k)


def test_int4_refinds_weights_on_the_q4_grid() -> None:
    w = q4_grid_weight(96, 128)
    x = torch.randn(5, 128)
    ref = F.linear(x.to(torch.bfloat16).float(), w)  # the kernel sees bf16 activations
    out = QuantizedLinear(w, None, 4)(x)
    assert out.dtype == torch.float32 and out.shape == (5, 96)
    assert torch.allclose(out, ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_int8_is_close_and_adds_the_bias() -> None:
    torch.manual_seed(1)
    w, b = torch.randn(48, 64) * 0.05, torch.randn(48)
    x = torch.randn(3, 64)
    out = QuantizedLinear(w, b, 8)(x)
    ref = F.linear(x, w, b)
    assert (out - ref).abs().max().item() < 0.02 * ref.abs().max().item()
    # Without the bias the result differs by exactly it: the bias is applied once.
    assert torch.allclose(out - QuantizedLinear(w, None, 8)(x), b.expand(3, 48), atol=1e-5)


def test_model_switches_modes_and_back_to_exact_float() -> None:
    torch.manual_seed(2)
    model = LlamaForCausalLM(ARCH).eval()
    model.requires_grad_(False)
    model.fuse()
    ids = [[3, 14, 15, 92, 65, 35]]
    ref = ModelStepper(model, max_len=16).step(ids)
    # The 6-row prefill takes the model's own float weights...
    model.quantize_weights("int4", max_rows=4, prefill_bf16=False)
    assert torch.equal(ModelStepper(model, max_len=16).step(ids), ref)
    # ... or their bf16 copy: close to the float result, not equal to it.
    model.quantize_weights("int4", max_rows=4, prefill_bf16=True)
    bf16 = ModelStepper(model, max_len=16).step(ids)
    assert not torch.equal(bf16, ref)
    assert (bf16 - ref).abs().max().item() < 0.05 * ref.abs().max().item()
    for mode in ("int8", "int4"):
        model.quantize_weights(mode)  # the default: decode sizes quantized, bf16 prefill if native
        assert model.weight_quant == mode and model.lm_head_quant is not None
        out = ModelStepper(model, max_len=16).step(ids)
        assert not torch.equal(out, ref)  # the quantized kernels really ran
        assert (out - ref).abs().max().item() < 0.1 * ref.abs().max().item()
    model.quantize_weights("none")
    assert model.lm_head_quant is None
    assert torch.equal(ModelStepper(model, max_len=16).step(ids), ref)


def test_large_products_run_on_a_bf16_copy_only_when_asked() -> None:
    torch.manual_seed(3)
    w, b = torch.randn(48, 64) * 0.05, torch.randn(48)
    x = torch.randn(30, 64)  # more rows than max_rows: the float path
    copied = QuantizedLinear(w, b, 8, max_rows=24, large_dtype=torch.bfloat16)
    out = copied(x)
    assert out.dtype == torch.float32
    assert copied.large_weight.dtype == torch.bfloat16 and copied.weight is w
    assert torch.equal(out, F.linear(x.bfloat16(), w.bfloat16()).float() + b)
    own = QuantizedLinear(w, b, 8, max_rows=24)
    assert own.large_weight is w  # no copy
    assert torch.equal(own(x), F.linear(x, w, b))
    # An asked-for output dtype holds with a bias too, on both paths.
    assert copied(x, torch.bfloat16).dtype == torch.bfloat16
    assert copied(x[:4], torch.bfloat16).dtype == torch.bfloat16


def test_quantized_swiglu_keeps_its_middle_in_bf16() -> None:
    torch.manual_seed(4)
    mlp = LlamaMLP(64, 128).eval()
    mlp.requires_grad_(False)
    mlp.fuse()
    mlp.quantize(QuantPlan(8, max_rows=4, large_dtype=torch.bfloat16))
    x = torch.randn(6, 64)  # a prefill: the bf16 copies
    assert mlp.gate_up_weight is not None
    gate, up = F.linear(x.bfloat16(), mlp.gate_up_weight.bfloat16()).split(128, -1)
    ref = F.linear(F.silu(gate) * up, mlp.down_proj.weight.bfloat16()).float()
    out = mlp(x)
    assert out.dtype == torch.float32 and torch.equal(out, ref)


def test_native_bf16_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not quant.native_bf16_matmul()
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert quant.native_bf16_matmul()
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"amx_bf16"}))
    assert quant.native_bf16_matmul()
    # The model's automatic choice follows it.
    model = LlamaForCausalLM(ARCH).eval()
    model.requires_grad_(False)
    model.fuse()
    model.quantize_weights("int8")
    assert model.lm_head_quant is not None
    assert model.lm_head_quant.large_weight.dtype == torch.bfloat16
    assert model.lm_head_quant.max_rows == quant.QUANT_MAX_ROWS_BF16  # bf16 wins sooner
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"avx2"}))
    model.quantize_weights("int8")
    assert model.lm_head_quant.large_weight is model.lm_head.weight
    assert model.lm_head_quant.max_rows == quant.QUANT_MAX_ROWS


@pytest.mark.skipif(not quant._fbgemm_linear(), reason="needs torch's fbgemm int8 linear")
@pytest.mark.parametrize("cpu", ["this", "no-vnni"])
def test_int8_activations_are_close_per_row_and_add_the_bias_once(
    cpu: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without VNNI fbgemm saturates on 8-bit inputs: 7-bit ones there (on this CPU, and
    # on any as if it had none).
    if cpu == "no-vnni":
        monkeypatch.setattr(quant, "vnni", lambda: False)
    torch.manual_seed(5)
    w, b = torch.randn(48, 64) * 0.05, torch.randn(48)
    x = torch.randn(4, 64)
    x[3] *= 1000.0  # one row's outlier must not flatten the others' grid
    layer = QuantizedLinear(w, b, 8, max_rows=8, int8_activations=True)
    assert layer.packed is not None and layer.compute_dtype(4) == torch.float32
    assert layer.reduce_range == (cpu == "no-vnni" or not quant.vnni())
    out = layer(x)
    ref = F.linear(x, w, b)
    assert out.dtype == torch.float32 and out.shape == (4, 48)
    for row in range(4):
        err = (out[row] - ref[row]).abs().max().item()
        assert err < 0.03 * (ref[row] - b).abs().max().item(), (row, err)
    # The bias is added once, after the scales: not multiplied by them.
    no_bias = QuantizedLinear(w, None, 8, max_rows=8, int8_activations=True)(x)
    assert torch.allclose(out - no_bias, b.expand(4, 48), atol=1e-3)
    # More rows than max_rows: the float weights, exactly.
    big = torch.randn(9, 64)
    assert torch.equal(layer(big), F.linear(big, w, b))
    with pytest.raises(WeightQuantUnavailableError, match="8-bit"):
        QuantizedLinear(w, None, 4, int8_activations=True)


def test_the_heads_int8_activations_follow_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    model = LlamaForCausalLM(ARCH).eval()
    model.requires_grad_(False)
    model.fuse()
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert not quant.int8_dot_products()
    model.quantize_weights("int4")
    assert model.lm_head_quant is not None and model.lm_head_quant.packed is None
    monkeypatch.setattr(quant, "_cpu_flags", lambda: frozenset({"avx2", "avx512_vnni"}))
    fbgemm = quant._fbgemm_linear()
    assert quant.int8_dot_products() == fbgemm
    model.quantize_weights("int4")
    assert (model.lm_head_quant.packed is not None) == fbgemm
    # The decoder's linears stay weight-only int4 either way.
    layer = model.model.layers[0]
    assert isinstance(layer, LlamaDecoderLayer) and layer.mlp.down_quant is not None
    assert layer.mlp.down_quant.packed is None and layer.mlp.down_quant.bits == 4
    # New weights (fuse) keep the plan, the head's choice included.
    model.fuse()
    assert (model.lm_head_quant.packed is not None) == fbgemm


def test_weight_quant_refuses_bad_modes_and_other_devices() -> None:
    assert check_weight_quant("int4", torch.device("cpu")) == "int4"
    assert check_weight_quant("none", torch.device("cuda")) == "none"
    with pytest.raises(WeightQuantUnavailableError, match="CPU only"):
        check_weight_quant("int8", torch.device("cuda"))
    with pytest.raises(WeightQuantUnavailableError, match="none, int8 or int4"):
        check_weight_quant("int2", torch.device("cpu"))
    with pytest.raises(WeightQuantUnavailableError, match="groups of 32"):
        QuantizedLinear(torch.randn(8, 48), None, 4)
