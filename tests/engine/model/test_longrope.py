"""LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini) and partial rotary against transformers.

Tiny random Phi-3 folders built by transformers itself, with a LongRoPE boundary at 16
positions and a context of 64. The engine switches to the long factors per position
(engine/model/rope.py, `longrope_switch`): that is transformers decoding on its own KV
cache, and its `generate` for sequences that stay within the boundary; both are
compared here.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from engine import LLM, SamplingParams
from engine.errors import UnsupportedModelError
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import load_model
from engine.model.rope import rope_settings
from tests.utils.hf_families import family_config, load_reference, make_family_dir
from tests.utils.model_step import ModelStepper

ORIGINAL = 16  # original_max_position_embeddings: positions from here on are "long"
CONTEXT = 64
NEW_TOKENS = 32
HEAD_DIM = 16  # TINY_SHAPE's


def _rope(partial: float, seed: int) -> dict[str, Any]:
    """A LongRoPE dict with random factors, long ones far from the short ones."""
    pairs = int(HEAD_DIM * partial) // 2
    rng = random.Random(seed)
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": partial,
        "short_factor": [1 + rng.random() for _ in range(pairs)],
        "long_factor": [3 + 20 * rng.random() for _ in range(pairs)],
    }


# Phi-3-mini-128k / Phi-3.5-mini shaped (whole-head rotary), and Phi-4-mini shaped
# (rotary over 3/4 of each head, tied embeddings).
SHAPES: dict[str, dict[str, Any]] = {
    "phi3-longrope": {"rope_parameters": _rope(1.0, seed=1)},
    "phi4-mini": {"rope_parameters": _rope(0.75, seed=2), "tie_word_embeddings": True},
}


def _folder(tmp_path: Path, shape: str, seed: int = 4, **overrides: Any) -> Path:
    fields = {
        "max_position_embeddings": CONTEXT,
        "original_max_position_embeddings": ORIGINAL,
        **SHAPES[shape],
        **overrides,
    }
    return make_family_dir(tmp_path, "phi3", seed=seed, **fields)


@pytest.fixture(scope="module", params=list(SHAPES))
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """(shape name, its folder), one per shape for the module."""
    return request.param, _folder(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture
def folder(case: tuple[str, Path]) -> Path:
    return case[1]


def _hf_logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def _hf_cached_logits(model: PreTrainedModel, prompt: list[int], rest: list[int]) -> torch.Tensor:
    """transformers' logits for `prompt` in one call, then `rest` one token per call on
    its KV cache (so each of those tokens' rotary is picked from its own position)."""
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        rows = [out.logits[0]]
        for token in rest:
            out = model(torch.tensor([[token]]), cache=out.cache, use_cache=True)
            rows.append(out.logits[0])
    return torch.cat(rows).float()


def _hf_cached_greedy(model: PreTrainedModel, prompt: list[int], steps: int) -> list[int]:
    """Arg-max decoding on transformers' KV cache, one token per forward call."""
    tokens: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        for _ in range(steps):
            tokens.append(int(out.logits[0, -1].argmax()))
            out = model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens


def _hf_generate(model: PreTrainedModel, prompt: list[int], steps: int) -> list[int]:
    """transformers' own greedy `generate` (cached; EOS not special)."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
    return list(out[0, len(prompt) :].tolist())


def test_the_rotary_is_read_as_transformers_reads_it(folder: Path) -> None:
    arch = load_model(str(folder), dtype=torch.float32, device="cpu").arch
    scaling = dict(arch.rope_scaling or ())
    assert scaling["rope_type"] == "longrope"
    assert scaling["original_max_position_embeddings"] == ORIGINAL
    # sqrt(1 + ln(64 / 16) / ln(16)), transformers' default attention factor.
    assert scaling["attention_factor"] == pytest.approx(1.5**0.5)
    partial = float(scaling.get("partial_rotary_factor", 1.0))
    assert len(scaling["short_factor"]) == int(HEAD_DIM * partial) // 2  # type: ignore[arg-type]
    assert arch.max_position_embeddings == CONTEXT  # the context limit is the long one


def test_logits_match_transformers_below_the_boundary(folder: Path) -> None:
    """A prompt shorter than the boundary, in two chunks beside another sequence."""
    model = load_model(str(folder), dtype=torch.float32, device="cpu").model
    reference = load_reference(folder)
    a, b = list(range(100, 113)), list(range(2000, 2009))
    stepper = ModelStepper(model, num_seqs=2, block_size=4)
    first = stepper.step([a[:7], b[:8]])
    second = stepper.step([a[7:], b[8:]])
    ours_a = torch.cat([first[:7], second[:6]])
    ours_b = torch.cat([first[7:], second[6:]])
    assert (ours_a - _hf_logits(reference, a)).abs().max() <= 1e-3
    assert (ours_b - _hf_logits(reference, b)).abs().max() <= 1e-3


def test_logits_past_the_boundary_match_transformers_decoding_on_its_cache(
    folder: Path,
) -> None:
    """30 tokens prefilled at once equal transformers' 12-token prompt then 18 cached
    decode steps (positions 16..29 long, the keys before them short, in both)."""
    model = load_model(str(folder), dtype=torch.float32, device="cpu").model
    reference = load_reference(folder)
    ids = list(range(300, 330))
    ours = ModelStepper(model, block_size=4).step([ids])
    theirs = _hf_cached_logits(reference, ids[:12], ids[12:])
    assert (ours - theirs).abs().max() <= 1e-3
    # transformers run on the whole 30 tokens at once rotates all of them with the long
    # factors: the documented difference (prompts past the boundary), visible here.
    assert (ours[:ORIGINAL] - _hf_logits(reference, ids)[:ORIGINAL]).abs().max() > 1e-2


def test_the_long_factors_are_used_past_the_boundary(
    tmp_path: Path, case: tuple[str, Path]
) -> None:
    """The same weights with long_factor := short_factor: equal logits up to position
    15, different ones from 16 on."""
    shape, folder = case
    rope = dict(SHAPES[shape]["rope_parameters"])
    short_only = _folder(
        tmp_path, shape, rope_parameters={**rope, "long_factor": rope["short_factor"]}
    )
    ids = list(range(500, 530))
    ours = ModelStepper(load_model(str(folder), dtype=torch.float32, device="cpu").model)
    plain = ModelStepper(load_model(str(short_only), dtype=torch.float32, device="cpu").model)
    a, b = ours.step([ids]), plain.step([ids])
    torch.testing.assert_close(a[:ORIGINAL], b[:ORIGINAL], atol=0, rtol=0)
    assert (a[ORIGINAL:] - b[ORIGINAL:]).abs().max(-1).values.min() > 1e-3


def test_greedy_tokens_match_transformers_on_its_cache_across_the_boundary(
    folder: Path,
) -> None:
    """Prompts below the boundary, 32 greedy tokens crossing it, beside each other and
    again on a prefix-cache hit: identical to transformers decoding on its KV cache."""
    llm = LLM(str(folder), max_model_len=CONTEXT, kv_cache_bytes=8 * 2**20, block_size=4)
    reference = load_reference(folder)
    prompts = [list(range(300, 310)), list(range(40, 53)), list(range(7000, 7016))]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    cold = llm.generate(prompts, params)
    warm = llm.generate(prompts, params)
    for ids, c, w in zip(prompts, cold, warm, strict=True):
        assert c.outputs[0].token_ids == _hf_cached_greedy(reference, ids, NEW_TOKENS)
        assert w.outputs[0].token_ids == c.outputs[0].token_ids and w.num_cached_tokens > 0


def test_greedy_tokens_match_transformers_generate_up_to_the_boundary(folder: Path) -> None:
    """Sequences that end at the boundary are identical to transformers' `generate`.

    (Past it, Phi-3's `generate` drops its cache the first time the sequence grows past
    the boundary and re-rotates every earlier key with the long factors; we keep them,
    see `longrope_switch`.)"""
    llm = LLM(str(folder), max_model_len=CONTEXT, kv_cache_bytes=8 * 2**20, block_size=4)
    reference = load_reference(folder)
    prompts = [list(range(300, 304)), list(range(40, 50))]
    for ids in prompts:
        steps = ORIGINAL - len(ids)  # the last token is predicted at position 15
        params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
        (out,) = llm.generate([ids], params)
        assert out.outputs[0].token_ids == _hf_generate(reference, ids, steps)


@pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="the fused kernels need CUDA or TRITON_INTERPRET=1",
)
def test_partial_rotary_on_the_fused_kernels_matches_the_torch_path(tmp_path: Path) -> None:
    from engine.model.fused import kernels_interpreted, load_fused_ops

    if not torch.cuda.is_available() and not kernels_interpreted():
        pytest.fail("the triton kernels were imported before TRITON_INTERPRET=1 was set")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    folder = _folder(tmp_path, "phi4-mini")
    torch_path = load_model(str(folder), dtype=torch.float32, device=device).model
    fused = load_model(str(folder), dtype=torch.float32, device=device).model
    fused.use_fused_ops(load_fused_ops())
    ids = list(range(100, 130))  # across the boundary
    expected = ModelStepper(torch_path).step([ids])
    got = ModelStepper(fused).step([ids])
    assert (got - expected).abs().max() <= 1e-4


def test_phi3_legacy_spellings_and_defaults_read_as_transformers_does() -> None:
    """Phi-3's first 128k configs said "su"; Phi3Config reads the original context from
    its own field (4096 when absent), never from the rope dict."""
    rope = _rope(1.0, seed=1)
    legacy = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")}
    config = family_config("phi3", max_position_embeddings=CONTEXT).to_dict()
    config.pop("rope_parameters", None)
    v4 = {**config, "rope_theta": 10000.0, "rope_scaling": {**legacy, "type": "su"}}
    v4["original_max_position_embeddings"] = ORIGINAL
    arch = architecture_from_config(v4)
    assert dict(arch.rope_scaling or ())["rope_type"] == "longrope"
    assert dict(arch.rope_scaling or ())["original_max_position_embeddings"] == ORIGINAL
    v4.pop("original_max_position_embeddings")
    v4["rope_scaling"] = {**legacy, "type": "longrope", "original_max_position_embeddings": 8}
    assert (
        dict(architecture_from_config(v4).rope_scaling or ())["original_max_position_embeddings"]
        == 4096
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"short_factor": [1.0] * 3}, "'short_factor' must have 8 entries"),
        ({"long_factor": None}, "'long_factor' must be a list of numbers"),
        ({"long_factor": [1.0] * 7 + [-2.0]}, "'long_factor' must be a list of numbers"),
        ({"short_factor": ["x"] * 8}, "'short_factor' must be a list of numbers"),
        ({"partial_rotary_factor": 0.7}, "partial_rotary_factor=0.7 gives 11 rotary dims"),
        ({"partial_rotary_factor": 1.5}, "must be in \\(0, 1\\]"),
    ],
)
def test_bad_longrope_settings_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    config = family_config("phi3", max_position_embeddings=CONTEXT).to_dict()
    config["rope_parameters"] = {**_rope(1.0, seed=1), **change}
    config["original_max_position_embeddings"] = ORIGINAL
    with pytest.raises(UnsupportedModelError, match=message):
        architecture_from_config(config)


def test_partial_rotary_without_scaling_is_kept() -> None:
    theta, scaling = rope_settings({"rope_theta": 500.0, "partial_rotary_factor": 0.5})
    assert (theta, scaling) == (500.0, (("partial_rotary_factor", 0.5), ("rope_type", "default")))
    assert (
        rope_settings({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}})[
            1
        ]
        is None
    )


# llama.cpp's names for a Phi-3 checkpoint's tensors (its converter keeps them fused).
_GGUF_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _write_phi3_gguf(path: Path, folder: Path, *, short_factors: bool = True) -> Path:
    """The F32 file llama.cpp's converter writes for a Phi-3 folder: the rotary width
    in rope.dimension_count, LongRoPE's factors as rope_factors_* tensors."""
    import json

    import numpy as np
    from gguf import GGUFWriter
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    rope = config["rope_parameters"]
    heads = config["num_attention_heads"]
    writer = GGUFWriter(str(path), "phi3")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(
        int(rope.get("partial_rotary_factor", 1.0) * config["hidden_size"]) // heads
    )
    writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
    writer.add_rope_scaling_attn_factors(1.5**0.5)
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if name in _GGUF_TOP:
            gguf = _GGUF_TOP[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            gguf = f"blk.{layer}.{_GGUF_BLOCK[module]}.{kind}"
        writer.add_tensor(gguf, np.ascontiguousarray(tensor.float().numpy()))
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    if short_factors:
        writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_phi3_longrope_gguf_computes_what_its_hf_folder_does(
    tmp_path: Path, case: tuple[str, Path]
) -> None:
    from gguf import GGUFReader

    from engine.model.gguf_loader import load_gguf_model, read_architecture

    shape, folder = case
    path = _write_phi3_gguf(tmp_path / f"{shape}.gguf", folder)
    read = read_architecture(GGUFReader(str(path)))
    expected = load_model(str(folder), dtype=torch.float32, device="cpu")
    # The same settings (factors as float32, which is what the rotary computes in).
    assert dict(read.rope_scaling or ()).keys() == dict(expected.arch.rope_scaling or ()).keys()
    assert read.max_position_embeddings == CONTEXT
    ours, _ = load_gguf_model(str(path), dtype=torch.float32, device="cpu")
    ids = list(range(700, 730))  # across the boundary
    torch.testing.assert_close(
        ModelStepper(ours).step([ids]),
        ModelStepper(expected.model).step([ids]),
        atol=1e-4,
        rtol=1e-4,
    )


def test_a_phi3_gguf_with_one_factor_tensor_is_refused(tmp_path: Path, folder: Path) -> None:
    from gguf import GGUFReader

    from engine.model.gguf_loader import read_architecture

    path = _write_phi3_gguf(tmp_path / "half.gguf", folder, short_factors=False)
    with pytest.raises(UnsupportedModelError, match="rope_factors_short.weight"):
        read_architecture(GGUFReader(str(path)))
