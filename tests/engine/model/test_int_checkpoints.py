"""GPTQ, AWQ and compressed-tensors pack-quantized Hugging Face checkpoints load
dequantized, compute what their decoded weights compute, and bad ones are refused by
name before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import UnsupportedModelError
from engine.model.gptq_awq_checkpoint import unpack_columns, unpack_rows
from engine.model.loader import load_model
from engine.planning.model_source import read_model_facts
from tests.utils.decoded_reference import logits_against_decoded
from tests.utils.hf_families import make_family_dir
from tests.utils.int_checkpoints import AWQ_PACK_ORDER, Layout, make_int_folder, pack_words

LAYOUTS = [
    (Layout("gptq"), "llama", "GPTQ 4-bit g32"),
    (Layout("gptq", variant="v2"), "qwen3", "GPTQ 4-bit g32"),
    (Layout("gptq", variant="act-order"), "phi3", "GPTQ 4-bit g32"),
    (Layout("gptq", bits=8, group=-1), "llama", "GPTQ 8-bit per row"),
    (Layout("gptq", bits=2, group=16), "mistral", "GPTQ 2-bit g16"),
    (Layout("awq"), "llama", "AWQ 4-bit g32"),
    (Layout("awq"), "mixtral", "AWQ 4-bit g32"),
    (Layout("pack-quantized"), "qwen2", "INT4 (pack-quantized, g32)"),
    (Layout("pack-quantized", bits=8, group=-1, variant="asym"), "llama",
     "INT8 (pack-quantized, channel)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "family", "label"), LAYOUTS, ids=[f"{lay.name}-{fam}" for lay, fam, _ in LAYOUTS]
)
def test_a_quantized_checkpoint_computes_what_its_decoded_weights_do(
    tmp_path: Path, layout: Layout, family: str, label: str
) -> None:
    folder, decoded = make_int_folder(tmp_path, family, layout)
    ours, reference = logits_against_decoded(
        folder,
        lambda arch: (pair for name, t in decoded.items() for pair in _mapped(arch, name, t)),
        [*range(300, 316)],
    )
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    assert read_model_facts(folder).quantization == label


def _mapped(arch: Any, name: str, tensor: torch.Tensor) -> Any:
    from engine.model.registry import family_named

    return family_named(arch.architecture).hf_weights(name, tensor, arch)


def test_four_bit_decoding_is_within_half_a_step_of_the_original(tmp_path: Path) -> None:
    folder, decoded = make_int_folder(tmp_path, "llama", Layout("awq"))
    original = load_file(str(make_family_dir(tmp_path / "o", "llama", seed=7,
                                             intermediate_size=96) / "model.safetensors"))  # fmt: skip
    name = "model.layers.1.mlp.down_proj.weight"
    w, d = original[name], decoded[name]
    step = (w.reshape(w.shape[0], -1, 32).amax(-1) - w.reshape(w.shape[0], -1, 32).amin(-1)) / 15
    assert (w - d).abs().max() > 0
    assert ((w - d).abs().reshape(w.shape[0], -1, 32) <= step.unsqueeze(-1) * 0.51 + 1e-3).all()


def test_unpacking_reads_each_format_s_word_order() -> None:
    values = torch.arange(64).reshape(8, 8) % 16
    assert torch.equal(unpack_rows(pack_words(values, 4, 0), 4), values)
    assert torch.equal(unpack_columns(pack_words(values, 4, 1), 4), values)
    awq = unpack_columns(pack_words(values, 4, 1, AWQ_PACK_ORDER), 4)
    # The raw nibbles are in AWQ's order; the loader puts them back.
    assert awq[0].tolist() == [values[0, c].item() for c in AWQ_PACK_ORDER]


def _with_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("layout", "changes", "words"),
    [
        (Layout("gptq"), {"bits": 3}, "bits=3"),
        (Layout("gptq"), {"checkpoint_format": "marlin"}, "'marlin'"),
        (Layout("gptq"), {"group_size": 0}, "group_size"),
        (Layout("awq"), {"version": "gemv"}, "'gemv'"),
        (Layout("awq"), {"zero_point": False}, "zero_point=False"),
        (Layout("pack-quantized"), {"config_groups": {
            "a": {"weights": {"num_bits": 4, "type": "int"}},
            "b": {"weights": {"num_bits": 8, "type": "int"}}}}, "one weight scheme"),
        (Layout("pack-quantized"), {"config_groups": {
            "a": {"weights": {"num_bits": 4, "type": "float"}}}}, "type 'float'"),
    ],
)  # fmt: skip
def test_layouts_without_plain_unpacking_are_refused_by_name(
    tmp_path: Path, layout: Layout, changes: dict[str, Any], words: str
) -> None:
    folder, _ = make_int_folder(tmp_path, "llama", layout)
    _with_config(folder, **changes)
    with pytest.raises(UnsupportedModelError, match=words):
        load_model(str(folder), dtype=torch.float32, device="cpu")


@pytest.mark.parametrize(
    ("layout", "edit", "words"),
    [
        (Layout("gptq"), lambda s: s.pop("model.layers.1.self_attn.k_proj.scales"),
         "k_proj' has no scales"),
        (Layout("awq"), lambda s: s.pop("model.layers.0.mlp.up_proj.qzeros"),
         "up_proj' has no qzeros"),
        (Layout("gptq"), lambda s: s.__setitem__("model.layers.0.mlp.up_proj.g_idx",
                                                  torch.full((64,), 99, dtype=torch.int32)),
         "needs 100 groups"),
        (Layout("gptq"), lambda s: s.__setitem__("model.layers.0.mlp.up_proj.qweight",
                                                  torch.zeros(8, 96)),
         "up_proj.qweight must be a 2-D int32"),
        (Layout("awq"), lambda s: s.__setitem__("model.layers.0.mlp.up_proj.scales",
                                                 torch.ones(2, 40, dtype=torch.float16)),
         "do not describe one AWQ"),
        (Layout("pack-quantized"), lambda s: s.pop("model.layers.0.mlp.up_proj.weight_shape"),
         "lacks weight_scale or weight_shape"),
    ],
)  # fmt: skip
def test_a_broken_quantized_tensor_is_refused_by_name(
    tmp_path: Path, layout: Layout, edit: Any, words: str
) -> None:
    folder, _ = make_int_folder(tmp_path, "llama", layout)
    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedModelError, match=words):
        load_model(str(folder), dtype=torch.float32, device="cpu")
