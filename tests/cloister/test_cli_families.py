"""`cloister models families`: the families the engine runs, for people and as JSON."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cloister.cli import main
from engine.model.gguf_loader import SUPPORTED_TENSOR_TYPES
from engine.model.registry import FAMILIES, SUPPORTED


def test_families_lists_every_registered_family_as_json() -> None:
    res = CliRunner().invoke(main, ["models", "families", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["family"] for r in rows] == [f.name for f in FAMILIES]
    assert {a for r in rows for a in r["hf_architectures"]} == set(SUPPORTED)
    assert {"Qwen3ForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM"} <= set(SUPPORTED)
    qwen3 = next(r for r in rows if r["family"] == "qwen3")
    assert qwen3["gguf_architectures"] == ["qwen3"]
    assert set(qwen3["gguf_tensor_types"]) == {t.name for t in SUPPORTED_TENSOR_TYPES}
    assert {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_NL"} <= set(qwen3["gguf_tensor_types"])


def test_families_prints_a_table_for_people() -> None:
    res = CliRunner().invoke(main, ["models", "families"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:2] == ["FAMILY", "HUGGING"]
    for family in FAMILIES:
        assert any(line.split()[0] == family.name for line in lines[1:]), family.name
    assert lines[-1].startswith("GGUF tensor types: ") and "Q6_K" in lines[-1]


def test_families_refuses_an_unknown_option_in_one_line() -> None:
    res = CliRunner().invoke(main, ["models", "families", "--family", "gpt2"])
    assert res.exit_code == 2
    assert "No such option" in res.output and "Traceback" not in res.output
