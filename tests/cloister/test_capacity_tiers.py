"""`cloister capacity` with the KV tiers under the device pool (issue 41): the L2 (host
memory) and L3 (disk) token capacity next to the device pool's, sized by the engine's
own per-block rule, and bad budgets as one-line usage errors (exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from cloister.cli import main
from engine.llm_engine import LLMEngine
from tests.utils.tiny_model import make_tiny_model_dir

# A 32-layer model with 8 KV heads of 128, fp16: 131,072 bytes per token, 2 MiB per block
# of 16 tokens; 64 GB of KV on the device.
SHAPE = [
    "capacity", "--layers", "32", "--kv-heads", "8", "--head-dim", "128",
    "--weights-gb", "16", "--device-memory-gb", "80",
    "--mean-prompt", "1000", "--mean-output", "200", "--itl-ms", "30",
]  # fmt: skip
PER_BLOCK = 2 * 32 * 8 * 128 * 2 * 16


def _run(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [*SHAPE, *args], env=env)


def _json(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    out = _run([*args, "--json"], env)
    assert out.exit_code == 0, out.output
    plan: dict[str, Any] = json.loads(out.output)
    return plan


def test_the_tiers_token_capacity_in_json_and_in_the_table() -> None:
    plan = _json(["--kv-host-bytes", str(100 * 10**9), "--kv-disk-bytes", str(10**12)])
    host, disk = plan["kv_tiers"]
    assert host["medium"] == "CPU_HOST" and disk["medium"] == "DISK"
    assert host["bytes_per_block"] == PER_BLOCK
    assert host["num_blocks"] == 100 * 10**9 // PER_BLOCK == 47_683
    assert host["token_capacity"] == 47_683 * 16
    # A block on disk is a file: the payload plus its header and digest.
    assert disk["bytes_per_block"] > PER_BLOCK
    assert disk["num_blocks"] == 10**12 // disk["bytes_per_block"]
    assert disk["token_capacity"] == disk["num_blocks"] * 16
    out = _run(["--kv-host-bytes", str(100 * 10**9), "--kv-disk-bytes", str(10**12)])
    assert out.exit_code == 0, out.output
    names = [line.split("  ", 1)[0] for line in out.output.splitlines()]
    # Next to the device pool's figure.
    at = names.index("resident token capacity")
    assert names[at + 1 : at + 3] == ["L2 host memory token capacity", "L3 disk token capacity"]
    rows = dict(line.split("  ", 1) for line in out.output.splitlines())
    assert rows["L2 host memory token capacity"].strip().startswith("762,928 tokens (47,683 blocks")
    assert f"{disk['token_capacity']:,} tokens" in rows["L3 disk token capacity"]


def test_no_tier_rows_without_budgets_and_block_size_counts() -> None:
    plain = _json([])
    assert "kv_tiers" not in plain
    assert "L2 host" not in _run([]).output and "L3 disk" not in _run([]).output
    bigger = _json(["--kv-host-bytes", str(PER_BLOCK * 8), "--block-size", "32"])
    (host,) = bigger["kv_tiers"]
    assert (host["num_blocks"], host["token_capacity"]) == (4, 128)


def test_the_settings_environment_is_read_as_serve_reads_it() -> None:
    env = {"CLOISTER_KV_HOST_BYTES": str(PER_BLOCK * 10), "CLOISTER_KV_DISK_BYTES": "0"}
    (host,) = _json([], env)["kv_tiers"]
    assert host["num_blocks"] == 10
    # A flag wins over the environment.
    (host,) = _json(["--kv-host-bytes", str(PER_BLOCK * 3)], env)["kv_tiers"]
    assert host["num_blocks"] == 3
    # serve's block size too: blocks twice as large, half as many, the same tokens.
    (host,) = _json([], {**env, "CLOISTER_BLOCK_SIZE": "32"})["kv_tiers"]
    assert (host["num_blocks"], host["token_capacity"]) == (5, 160)


def test_a_budget_smaller_than_a_block_says_the_tier_is_off() -> None:
    out = _run(["--kv-host-bytes", "1000"])
    assert out.exit_code == 0, out.output
    rows = dict(line.split("  ", 1) for line in out.output.splitlines())
    assert rows["L2 host memory token capacity"].strip() == (
        f"0 tokens: 1,000 B holds no {PER_BLOCK:,}-byte block"
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--kv-host-bytes", "-1"], None, "'-1' must be 0 or more bytes"),
        (["--kv-host-bytes", "lots"], None, "'lots' is not a whole number of bytes"),
        (["--kv-host-bytes", "1.5e9"], None, "is not a whole number of bytes"),
        (["--kv-host-bytes", "10", "--kv-disk-bytes", "-3"], None, "must be 0 or more bytes"),
        ([], {"CLOISTER_KV_HOST_BYTES": "-7"}, "'-7' must be 0 or more bytes"),
        ([], {"CLOISTER_KV_DISK_BYTES": "big"}, "'big' is not a whole number of bytes"),
        (["--kv-disk-bytes", "1000000"], None, "--kv-disk-bytes needs --kv-host-bytes"),
        (["--kv-host-bytes", "10", "--block-size", "0"], None, "--block-size"),
    ],
)
def test_bad_budgets_are_one_line_usage_errors(
    args: list[str], env: dict[str, str] | None, message: str
) -> None:
    out = _run(args, env)
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert out.output.startswith("error: ") and len(out.output.strip().splitlines()) == 1
    assert "Traceback" not in out.output


def test_the_figures_are_the_blocks_the_engine_makes(tmp_path: Path) -> None:
    """The worksheet's L2 and L3 blocks for a model are the tiers an engine of that model
    builds from the same budgets (block size 8, fp32 KV, as the tiny model runs on a CPU)."""
    model = make_tiny_model_dir(tmp_path / "model")
    host_bytes, disk_bytes = 1_000_000, 3_000_000
    out = CliRunner().invoke(
        main,
        [
            "capacity", "--model", str(model), "--kv-dtype", "fp32", "--weight-dtype", "fp32",
            "--device-memory-gb", "1", "--mean-prompt", "100", "--mean-output", "10",
            "--itl-ms", "10", "--block-size", "8", "--kv-host-bytes", str(host_bytes),
            "--kv-disk-bytes", str(disk_bytes), "--json",
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    planned = {t["medium"]: t for t in json.loads(out.output)["kv_tiers"]}
    engine = LLMEngine.from_options(
        str(model),
        num_blocks=12,
        block_size=8,
        kv_host_bytes=host_bytes,
        kv_disk_path=str(tmp_path / "l3"),
        kv_disk_bytes=disk_bytes,
    )
    try:
        built = {t.medium: t for t in engine.stats().kv_tiers}
        assert planned.keys() == built.keys() == {"CPU_HOST", "DISK"}
        for medium, tier in built.items():
            assert planned[medium]["num_blocks"] == tier.capacity_blocks > 0, medium
        assert planned["CPU_HOST"]["bytes_per_block"] == engine.capacity.bytes_per_block
    finally:
        engine.close()
