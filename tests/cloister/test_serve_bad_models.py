"""A model file that cannot be served stops `cloister serve` with one clear line.

Hostile or corrupt inputs: absurd sizes in config.json, a missing field, an unknown
architecture, an unsupported or broken quantization, a missing tensor, a truncated GGUF, a GGUF tensor of an unknown type.
Each is refused naming the file, with no traceback; those found in the metadata are
refused before anything is made (no database).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from cloister.commands.serve import serve
from engine.errors import UnsupportedModelError
from engine.model.hf_loader import architecture_from_config
from engine.model.loader import load_model
from tests.engine.model.gguf_files import write_model_gguf
from tests.utils.int_checkpoints import Layout, make_int_folder
from tests.utils.tiny_model import make_tiny_model_dir, random_state_dict, tiny_config


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def absurd_hidden(tmp: Path) -> Path:
    folder = make_tiny_model_dir(tmp)
    _edit_config(folder, hidden_size=10**12)
    return folder


def missing_field(tmp: Path) -> Path:
    folder = make_tiny_model_dir(tmp)
    _edit_config(folder, num_hidden_layers=None)
    return folder


def unknown_architecture(tmp: Path) -> Path:
    folder = make_tiny_model_dir(tmp)
    _edit_config(folder, architectures=["GPT2LMHeadModel"])
    return folder


def gptq_folder(tmp: Path) -> Path:
    folder = make_tiny_model_dir(tmp)
    _edit_config(folder, quantization_config={"quant_method": "gptq", "bits": 3})
    return folder


def awq_without_zeros(tmp: Path) -> Path:
    folder, _ = make_int_folder(tmp, "llama", Layout("awq"))
    state = load_file(str(folder / "model.safetensors"))
    state.pop("model.layers.1.self_attn.o_proj.qzeros")
    save_file(state, str(folder / "model.safetensors"))
    return folder


def missing_tensor(tmp: Path) -> Path:
    folder = make_tiny_model_dir(tmp)
    state = load_file(str(folder / "model.safetensors"))
    state.pop("model.layers.1.mlp.down_proj.weight")
    save_file(state, str(folder / "model.safetensors"))
    return folder


def truncated_gguf(tmp: Path) -> Path:
    arch = architecture_from_config(tiny_config())
    path = write_model_gguf(tmp / "m.gguf", arch, random_state_dict(arch, seed=1))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return path


def unknown_tensor_type(tmp: Path) -> Path:
    arch = architecture_from_config(tiny_config(intermediate=256))
    down = "model.layers.1.mlp.down_proj.weight"  # [64, 256]: one 256-value block a row
    iq2 = (np.zeros((64, 66), dtype=np.uint8), GGMLQuantizationType.IQ2_XXS)
    return write_model_gguf(tmp / "m.gguf", arch, random_state_dict(arch, seed=1), raw={down: iq2})


# (maker, words the error must hold, refused before the database is made)
CASES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...], bool]] = {
    "absurd-hidden": (absurd_hidden, ("hidden_size", "1000000000000"), True),
    "missing-field": (missing_field, ("config.json lacks", "num_hidden_layers"), True),
    "unknown-architecture": (unknown_architecture, ("GPT2LMHeadModel", "Qwen3ForCausalLM"), True),
    "gptq-3-bit": (gptq_folder, ("GPTQ", "bits=3", "not supported"), True),
    "awq-without-zeros": (awq_without_zeros, ("o_proj' has no qzeros",), False),
    "missing-tensor": (missing_tensor, ("down_proj",), False),
    "truncated-gguf": (truncated_gguf, ("as GGUF",), True),
    "unknown-tensor-type": (
        unknown_tensor_type,
        ("blk.1.ffn_down.weight", "IQ2_XXS", "Q6_K"),
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_model_stops_serve_with_its_file_named(tmp_path: Path, case: str) -> None:
    make, words, before_anything = CASES[case]
    (tmp_path / "model").mkdir()
    path = make(tmp_path / "model")
    handlers = list(logging.getLogger().handlers)
    result = CliRunner().invoke(
        serve, ["--data-dir", str(tmp_path / "data"), "--model", f"bad={path}"]
    )
    for handler in logging.getLogger().handlers:
        if handler not in handlers:  # the one serve installed before the engine load
            logging.getLogger().removeHandler(handler)
    assert result.exit_code == 1, (result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert str(path) in errors[0]
    for word in words:
        assert word in errors[0], (word, errors[0])
    if before_anything:
        assert not (tmp_path / "data" / "cloister.db").exists()


@pytest.mark.parametrize("case", ["missing-tensor", "truncated-gguf", "absurd-hidden"])
def test_the_loader_names_the_file_and_holds_nothing(tmp_path: Path, case: str) -> None:
    make, words, _ = CASES[case]
    (tmp_path / "model").mkdir()
    path = make(tmp_path / "model")
    with pytest.raises(UnsupportedModelError) as refused:
        load_model(str(path), dtype=torch.float32, device="cpu")
    assert str(path) in str(refused.value)
    assert all(word in str(refused.value) for word in words)


def test_a_bad_reasoning_parser_setting_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import click

    from cloister.commands.serve import load_settings

    monkeypatch.setenv("CLOISTER_REASONING_PARSER", "deepseek")
    with pytest.raises(click.ClickException, match="reasoning_parser"):
        load_settings()
