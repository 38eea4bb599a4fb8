"""Speculative decoding's settings (issue 40): the four reach the engine from the settings,
the environment and both commands' flags; a bad value stops the server at start with the
setting's name, before anything is made; the startup summary says whether it is on."""

from __future__ import annotations

import logging
import typing
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from server.settings import EngineSettings, Settings
from tests.utils.cli_refusals import assert_refused_by_name

BAD_SETTINGS = [
    ("num_speculative_tokens", 0),
    ("num_speculative_tokens", -3),
    ("num_speculative_tokens", 10**6),
    ("speculative_method", "eagle"),
    ("speculative_model", "/models/draft"),  # without the draft method
    ("speculative_max_batch", 0),
    ("speculative_max_batch", -1),
]


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_bad_speculative_settings_areassert_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(ValidationError, match=name):
        Settings(**{name: value})


def test_the_draft_method_needs_its_model_and_only_it_takes_one(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="speculative_model"):
        Settings(speculative_method="draft")
    with pytest.raises(ValidationError, match="speculative_model"):
        Settings(speculative_method="ngram", speculative_model="/models/draft")
    ok = Settings(speculative_method="draft", speculative_model=str(tmp_path))
    assert ok.engine.speculative_model == str(tmp_path)


def test_a_missing_draft_model_is_refused_before_anything_loads(tmp_path: Path) -> None:
    """The served model takes minutes to load on a CPU; a draft path that is not there
    stops the settings, by name, instead of the engine after that load (both commands:
    SPEC_FLAGS)."""
    missing = tmp_path / "no-such-draft.gguf"
    with pytest.raises(ValidationError, match="speculative_model .*no such file or folder"):
        Settings(speculative_method="draft", speculative_model=str(missing))


@pytest.mark.parametrize(("name", "value"), BAD_SETTINGS)
def test_bad_speculative_environment_is_a_clear_error(
    name: str, value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import click

    from cloister.commands.serve import load_settings

    monkeypatch.setenv(f"CLOISTER_{name.upper()}", str(value))
    with pytest.raises(click.ClickException, match=name):
        load_settings()


def test_the_settings_bounds_are_the_engines() -> None:
    """Settings repeats engine.config's choices and bound (it does not import torch)."""
    from engine.config import MAX_SPECULATIVE_TOKENS, SPECULATIVE_METHODS

    fields = EngineSettings.model_fields
    assert typing.get_args(fields["speculative_method"].annotation) == SPECULATIVE_METHODS
    bounds = {type(m).__name__: m for m in fields["num_speculative_tokens"].metadata}
    assert bounds["Ge"].ge == 1 and bounds["Le"].le == MAX_SPECULATIVE_TOKENS
    Settings(num_speculative_tokens=MAX_SPECULATIVE_TOKENS)  # the bound itself is allowed
    with pytest.raises(ValidationError, match="num_speculative_tokens"):
        Settings(num_speculative_tokens=MAX_SPECULATIVE_TOKENS + 1)


def test_speculation_is_off_by_default_and_reaches_the_engine_config(tmp_path: Path) -> None:
    from assembly.engine_options import serve_engine_options
    from engine.engine_builder import build_config

    off = build_config("m", **serve_engine_options(Settings(data_dir=tmp_path)))
    assert off.speculative.speculative_method == "off" and not off.speculative.enabled
    on = Settings(
        data_dir=tmp_path,
        speculative_method="ngram",
        num_speculative_tokens=3,
        speculative_max_batch=12,
        speculative_model="",  # an empty environment value is unset, not a draft model
    )
    config = build_config("m", **serve_engine_options(on)).speculative
    assert config.enabled
    assert (config.num_speculative_tokens, config.speculative_max_batch) == (3, 12)
    assert config.speculative_model is None
    model = tmp_path / "draft.gguf"
    model.write_bytes(b"GGUF")
    draft = Settings(data_dir=tmp_path, speculative_method="draft", speculative_model=str(model))
    config = build_config("m", **serve_engine_options(draft)).speculative
    assert (config.speculative_method, config.speculative_model) == ("draft", str(model))


SPEC_FLAGS = [
    ["--num-speculative-tokens", "0"],
    ["--num-speculative-tokens", "-1"],
    ["--num-speculative-tokens", "1000000"],
    ["--num-speculative-tokens", "four"],
    ["--speculative-method", "eagle"],
    ["--speculative-model", "/models/draft"],  # without --speculative-method draft
    ["--speculative-model", "/nonexistent/draft.gguf", "--speculative-method", "draft"],
    ["--speculative-max-batch", "0"],
]


@pytest.mark.parametrize("flags", SPEC_FLAGS)
def test_cloister_serve_refuses_bad_speculative_flags(flags: list[str], tmp_path: Path) -> None:
    from cloister.commands.serve import serve

    handlers = list(logging.getLogger().handlers)
    result = CliRunner().invoke(serve, ["--data-dir", str(tmp_path), *flags])
    assert logging.getLogger().handlers == handlers
    assert_refused_by_name(result, flags)
    assert not (tmp_path / "cloister.db").exists()  # refused before anything started


@pytest.mark.parametrize("flags", SPEC_FLAGS)
def test_cloister_engine_serve_refuses_bad_speculative_flags(
    flags: list[str], tmp_path: Path
) -> None:
    from cloister.commands.engine_serve import engine

    result = CliRunner().invoke(
        engine, ["serve", "--insecure-loopback", "--data-dir", str(tmp_path), *flags]
    )
    assert_refused_by_name(result, flags)


@pytest.mark.parametrize("command", ["serve", "engine serve"])
def test_both_commands_pass_the_speculative_flags_to_the_engine(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flags become settings, and the settings the engine options each command loads
    its engine with (stopped there: no model is loaded)."""
    from assembly.engine_options import serve_engine_options
    from cloister.commands import engine_serve, serve
    from engine.engine_builder import build_config

    seen: list[Settings] = []

    class Stop(Exception):
        """Ends the command where it would start serving."""

    def capture(settings: Settings, **_: Any) -> None:
        seen.append(settings)
        raise Stop

    flags = [
        "--data-dir", str(tmp_path), "--speculative-method", "ngram",
        "--num-speculative-tokens", "7", "--speculative-max-batch", "5",
    ]  # fmt: skip
    if command == "serve":
        monkeypatch.setattr(serve, "run_server", capture)
        result = CliRunner().invoke(serve.serve, flags)
    else:
        monkeypatch.setattr(engine_serve, "run_engine_server", capture)
        result = CliRunner().invoke(engine_serve.engine, ["serve", "--insecure-loopback", *flags])
    assert isinstance(result.exception, Stop), result.output
    (settings,) = seen
    spec = build_config("m", **serve_engine_options(settings)).speculative
    assert (spec.speculative_method, spec.num_speculative_tokens) == ("ngram", 7)
    assert spec.speculative_max_batch == 5


class StubEngine:
    """The little of an engine client the summary reads."""

    max_model_len = 512

    def stats(self) -> Any:
        """A KV pool of 8 blocks of 16."""
        return SimpleNamespace(num_blocks=8, block_size=16)


def _summary(settings: Settings) -> str:
    from assembly.engine_options import serve_engine_options
    from assembly.startup_summary import build_summary

    options = serve_engine_options(settings, cuda_available=False)
    return str(build_summary(settings, {"m": StubEngine()}, options).text())


def test_the_startup_summary_says_whether_speculation_is_on(tmp_path: Path) -> None:
    off = "  decoding   speculative decoding off; overlap scheduling on\n"
    assert off in _summary(Settings(data_dir=tmp_path))
    on = _summary(Settings(data_dir=tmp_path, speculative_method="ngram", num_speculative_tokens=5))
    assert (
        "  decoding   speculative decoding on (ngram, up to 5 draft tokens a step; "
        "batch limit from measured step costs); overlap scheduling off (not with "
        "speculative decoding)\n"
    ) in on
    capped = _summary(
        Settings(data_dir=tmp_path, speculative_method="ngram", speculative_max_batch=6)
    )
    assert "none above 6 running sequences" in capped
    model = tmp_path / "d.gguf"
    model.write_bytes(b"GGUF")
    draft = _summary(
        Settings(data_dir=tmp_path, speculative_method="draft", speculative_model=str(model))
    )
    assert f"speculative decoding on (draft with {model}, up to 4 draft tokens" in draft
