"""Float linears through oneDNN-packed weights on the CPU (engine/model/cpu_linear.py): the
same products as F.linear for any number of rows, small or non-float32 weights never
packed, and a whole model's logits unchanged within float rounding, with the switch
reaching it from the engine's config."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine.config import ModelArchitecture
from engine.model.cpu_linear import MIN_PACKED_WEIGHT, cpu_packing_available, packed_linear
from engine.model.llama import LlamaForCausalLM
from tests.utils.model_step import TINY_ARCH, ModelStepper

pytestmark = pytest.mark.skipif(
    not cpu_packing_available(), reason="this torch build has no oneDNN linear packing"
)

# Large enough that every linear is packed (the smallest, o_proj, is 512 x 512 = 2**18).
PACKED_ARCH = dataclasses.replace(
    TINY_ARCH,
    vocab_size=600,
    hidden_size=512,
    intermediate_size=1024,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item()))


@pytest.mark.parametrize("bias", [True, False])
def test_packed_products_equal_f_linear_for_every_row_count(bias: bool) -> None:
    torch.manual_seed(0)
    weight = torch.randn(768, 512)
    b = torch.randn(768) if bias else None
    packed = packed_linear(weight, b)
    assert packed is not None
    for rows in (1, 2, 3, 9, 32, 300):
        x = torch.randn(rows, 512)
        ref = F.linear(x, weight, b)
        got = packed(x)
        assert got.shape == ref.shape
        assert _close(got, ref), rows
    assert packed(torch.randn(0, 512)).shape == (0, 768)
    # A non-contiguous input (a slice of a wider activation) gives the same product.
    wide = torch.randn(9, 1024)
    assert _close(packed(wide[:, ::2]), F.linear(wide[:, ::2], weight, b))


def test_small_and_non_float32_weights_are_not_packed() -> None:
    assert packed_linear(torch.randn(MIN_PACKED_WEIGHT // 512 - 1, 512)) is None
    assert packed_linear(torch.randn(MIN_PACKED_WEIGHT // 512, 512)) is not None
    assert packed_linear(torch.randn(1024, 512, dtype=torch.bfloat16)) is None
    assert packed_linear(torch.randn(1024, 512).to(torch.float64)) is None


def _model(arch: ModelArchitecture) -> LlamaForCausalLM:
    torch.manual_seed(3)
    model = LlamaForCausalLM(arch).eval()
    model.requires_grad_(False)
    model.fuse()
    return model


def test_a_model_gives_the_same_logits_with_packed_linears_and_back() -> None:
    model = _model(PACKED_ARCH)
    prompts = [[3, 14, 15, 92, 65, 35, 8, 97, 93], [2, 71, 82, 81, 82, 84, 59]]
    ref = ModelStepper(model, num_seqs=2, max_len=32).step(prompts)
    model.use_cpu_packed_linears(True)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_packed is not None and attn.o_packed is not None
    assert mlp.gate_up_packed is not None and mlp.down_packed is not None
    assert model.lm_head_packed is not None
    out = ModelStepper(model, num_seqs=2, max_len=32).step(prompts)
    assert not torch.equal(out, ref)  # the packed kernels really ran
    assert _close(out, ref)
    assert out.argmax(-1).tolist() == ref.argmax(-1).tolist()
    model.use_cpu_packed_linears(False)
    assert attn.qkv_packed is None and model.lm_head_packed is None
    assert torch.equal(ModelStepper(model, num_seqs=2, max_len=32).step(prompts), ref)


def test_new_weights_are_packed_again_and_tiny_models_never_are() -> None:
    model = _model(PACKED_ARCH)
    model.use_cpu_packed_linears(True)
    before = model.model.layers[0].mlp.down_packed
    model.load_weights((n, p.detach() * 0.5) for n, p in model.named_parameters())
    after = model.model.layers[0].mlp.down_packed
    assert before is not None and after is not None and after is not before
    x = torch.randn(6, PACKED_ARCH.intermediate_size)
    down = model.model.layers[0].mlp.down_proj.weight
    assert _close(after(x), F.linear(x, down))
    tiny = _model(TINY_ARCH)
    tiny.use_cpu_packed_linears(True)
    assert tiny.model.layers[0].self_attn.qkv_packed is None and tiny.lm_head_packed is None


def test_the_engine_config_switches_packing() -> None:
    from tests.engine.runner.factory import tiny_engine

    for on in (True, False):
        model = _model(PACKED_ARCH)
        tiny_engine(PACKED_ARCH, model, cpu_packed_linears=on, kv_cache_bytes=1 << 22)
        assert (model.lm_head_packed is not None) is on


def test_mixture_of_experts_products_run_packed_with_the_same_result() -> None:
    import dataclasses

    from engine.model.moe import MoEBlock
    from tests.utils.model_step import TINY_ARCH

    arch = dataclasses.replace(
        TINY_ARCH,
        hidden_size=512,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=384,  # [768, 512] and [512, 384]: large enough to pack
    )
    torch.manual_seed(0)
    block = MoEBlock(arch)
    block.fuse()
    x = torch.randn(9, 512)
    with torch.no_grad():
        plain = block(x)
        block.pack_for_cpu(True)
        assert block.packed is not None and all(p is not None for p in block.packed[0])
        packed = block(x)
        block.pack_for_cpu(False)
        assert block.packed is None
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-4)
