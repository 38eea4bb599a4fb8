"""Overlap scheduling reached as an operator reaches it (issue 45 item 4): on by default
in `cloister serve`, off with `--no-overlap` (or CLOISTER_ENGINE__OVERLAP_SCHEDULING=false),
said in the startup summary, counted on /metrics, and the same completions either way."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from assembly.engine_options import serve_engine_options
from assembly.startup_summary import build_summary
from engine.engine_builder import build_config
from server.settings import Settings
from tests.utils.built_app import tiny_model_app

STEPS = re.compile(r'^cloister_engine_steps_total\{mode="(\w+)",model_name="tiny"\} (\S+)$', re.M)
PROMPTS = [[11, 12, 13, 14], [21, 22] * 9, [5] * 30, [7, 8, 9]]


def completions(tmp_path: Path, **engine: Any) -> tuple[list[dict[str, Any]], str]:
    """Four concurrent greedy completions and a seeded one; the /metrics text after."""
    client, key = tiny_model_app(tmp_path, max_model_len=512, **engine)
    answers: list[dict[str, Any]] = [{} for _ in PROMPTS]

    def complete(i: int) -> None:
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": PROMPTS[i],
            "max_tokens": 12 + 3 * i,
            "temperature": 0,
            "ignore_eos": True,
        }
        r = client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        answers[i] = r.json()

    with client:
        threads = [threading.Thread(target=complete, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        metrics = client.get("/metrics").text
    client.app.state.metering.close()  # type: ignore[attr-defined]
    return answers, metrics


def test_completions_are_the_same_with_and_without_overlap(tmp_path: Path) -> None:
    on, on_metrics = completions(
        tmp_path / "on", overlap_min_forward_ms=0.0
    )  # whatever it measures
    off, off_metrics = completions(tmp_path / "off", overlap_scheduling=False)
    assert [a["choices"][0]["text"] for a in on] == [a["choices"][0]["text"] for a in off]
    assert [a["usage"] for a in on] == [a["usage"] for a in off]
    assert [a["usage"]["completion_tokens"] for a in on] == [12, 15, 18, 21]
    steps = {mode: float(n) for mode, n in STEPS.findall(on_metrics)}
    assert steps.get("overlapped", 0) > 10, on_metrics[:3000]
    assert not STEPS.findall(off_metrics)  # no series where it is off


def test_the_flag_and_the_variable_turn_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloister.commands import serve

    seen: list[Settings] = []

    class Stop(Exception):
        """Ends the command where it would start serving."""

    def capture(settings: Settings, **_: Any) -> None:
        seen.append(settings)
        raise Stop

    monkeypatch.setattr(serve, "run_server", capture)
    for flags in ([], ["--no-overlap"], ["--overlap"]):
        result = CliRunner().invoke(serve.serve, ["--data-dir", str(tmp_path), *flags])
        assert isinstance(result.exception, Stop), result.output
    assert [s.engine.overlap_scheduling for s in seen] == [True, False, True]
    monkeypatch.setenv("CLOISTER_ENGINE__OVERLAP_SCHEDULING", "false")
    off = Settings(data_dir=tmp_path)
    assert build_config("m", **serve_engine_options(off)).scheduler.overlap_scheduling is False
    monkeypatch.setenv("CLOISTER_ENGINE__OVERLAP_SCHEDULING", "sometimes")
    result = CliRunner().invoke(serve.serve, ["--data-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "overlap_scheduling" in result.output and "Traceback" not in result.output


class StubEngine:
    """The little of an engine client the summary reads."""

    max_model_len = 512

    def stats(self) -> Any:
        """A KV pool of 64 blocks of 16."""
        from types import SimpleNamespace

        return SimpleNamespace(num_blocks=64, block_size=16)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({}, "overlap scheduling on"),
        ({"overlap_scheduling": False}, "overlap scheduling off"),
        (
            {"speculative_method": "ngram"},
            "overlap scheduling off (not with speculative decoding)",
        ),
        (
            {"kv_host_bytes": 1 << 20},
            "overlap scheduling off (not with the KV tiers)",
        ),
    ],
)
def test_the_startup_summary_says_whether_steps_overlap(
    tmp_path: Path, settings: dict[str, Any], said: str
) -> None:
    config = Settings(data_dir=tmp_path, device="cpu", **settings)
    engines: dict[str, Any] = {spec.name: StubEngine() for spec in config.served_models}
    text = build_summary(config, engines, serve_engine_options(config, cuda_available=False)).text()
    assert said in text, text
