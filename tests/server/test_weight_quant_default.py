"""`weight_quant=auto` on `cloister serve`: resolved per model file and device, and the
startup summary says which path runs and that `auto` chose it. The default stays
`none` (see the setting's comment: the noisy-neighbour bound)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import pytest
from click.testing import CliRunner

from assembly.engine_options import DeviceUnavailableError, serve_engine_options
from assembly.startup_summary import build_summary
from server.settings import Settings


class StubEngine:
    """The little of an engine client the summary reads."""

    max_model_len = 8192

    def stats(self) -> Any:
        """A KV pool of 64 blocks of 16."""
        return SimpleNamespace(num_blocks=64, block_size=16)


def summary_text(settings: Settings) -> str:
    """The startup block on a CPU for stub engines named by `settings`'s served models."""
    engines: dict[str, Any] = {spec.name: StubEngine() for spec in settings.served_models}
    return build_summary(
        settings, engines, serve_engine_options(settings, cuda_available=False)
    ).text()


def test_auto_reaches_the_engine_on_a_cpu_and_none_stays_the_default(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).engine.weight_quant == "none"
    settings = Settings(data_dir=tmp_path, weight_quant="auto")
    assert serve_engine_options(settings, cuda_available=False)["weight_quant"] == "auto"
    # On CUDA, as before: float weights (the int8/int4 kernels are the CPU's).
    assert serve_engine_options(settings, cuda_available=True)["weight_quant"] == "none"


def test_the_summary_says_auto_chose_int4_for_the_bundled_model(tmp_path: Path) -> None:
    text = summary_text(Settings(data_dir=tmp_path, device="cpu", weight_quant="auto"))
    assert "weights int4 (auto, from Q4_1 GGUF)" in text, text


def test_the_summary_says_auto_kept_a_float_folder_float(tmp_path: Path) -> None:
    from tests.utils.tiny_model import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "tiny")
    settings = Settings(
        data_dir=tmp_path,
        device="cpu",
        weight_quant="auto",
        models=f"tiny={folder}",  # type: ignore[arg-type]
    )
    text = summary_text(settings)
    assert "weights none (auto, Hugging Face folder)" in text, text


def test_an_explicit_mode_is_shown_as_asked(tmp_path: Path) -> None:
    text = summary_text(Settings(data_dir=tmp_path, device="cpu", weight_quant="none"))
    assert "weights none, attention" in text, text


def test_several_models_show_each_one_s_path(tmp_path: Path) -> None:
    from engine.model.loader import default_model_path
    from tests.utils.tiny_model import make_tiny_model_dir

    folder = make_tiny_model_dir(tmp_path / "tiny")
    models = f"smol={default_model_path()},tiny={folder}"
    settings = Settings(
        data_dir=tmp_path,
        device="cpu",
        weight_quant="auto",
        models=models,  # type: ignore[arg-type]
    )
    text = summary_text(settings)
    assert (
        "weights smol: int4 (auto, from Q4_1 GGUF); tiny: none (auto, Hugging Face folder)" in text
    ), text


@pytest.mark.parametrize("bad", ["fast", "INT4", "int2", ""])
def test_bad_values_are_refused_by_name(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloister.commands.serve import load_settings

    monkeypatch.setenv("CLOISTER_WEIGHT_QUANT", bad)
    with pytest.raises(click.ClickException, match="weight_quant: Input should be 'auto'"):
        load_settings()


def test_the_flag_takes_auto_and_refuses_other_words() -> None:
    from cloister.cli import main

    result = CliRunner().invoke(main, ["serve", "--weight-quant", "fast"])
    assert result.exit_code == 2
    assert "'auto', 'none', 'int8', 'int4'" in result.output


def test_quantized_modes_are_still_refused_off_the_cpu(tmp_path: Path) -> None:
    with pytest.raises(DeviceUnavailableError, match="CPU only"):
        serve_engine_options(Settings(data_dir=tmp_path, weight_quant="int4"), cuda_available=True)
