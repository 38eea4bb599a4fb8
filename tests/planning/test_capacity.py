"""The capacity worksheet against the serving guide's worked example (sections 2.3 and 3.1)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from cloister.cli import main
from engine.model.loader import default_model_path
from engine.planning.capacity import (
    CapacityInputError,
    Hardware,
    ModelShape,
    Workload,
    count_parameters,
    plan_capacity,
)
from engine.planning.model_source import read_model_architecture

GB = 10**9
# A 70B-class model: 80 layers, 8 KV heads, head dim 128, fp16; 4 ranks of 80 GB, 140 GB of
# weights and 5 GB of overhead per rank; 400 req/s of 3,000-token prompts, 350 output
# tokens at 45 ms, p99 prompt 24,000 tokens.
EXAMPLE = [
    "capacity", "--layers", "80", "--kv-heads", "8", "--head-dim", "128",
    "--kv-dtype", "fp16", "--weights-gb", "140", "--device-memory-gb", "80",
    "--ranks", "4", "--overhead-gb", "5", "--mean-prompt", "3000", "--p99-prompt", "24000",
    "--mean-output", "350", "--itl-ms", "45", "--peak-rps", "400", "--context-tokens", "8000",
]  # fmt: skip


def test_the_guides_worked_example() -> None:
    out = CliRunner().invoke(main, [*EXAMPLE, "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2 == 327_680  # 320 KiB
    assert plan["kv_bytes_per_token_by_dtype"] == {
        "fp32": 655_360, "bf16": 327_680, "fp16": 327_680, "fp8": 163_840,
    }  # fmt: skip
    assert plan["weight_bytes_per_rank"] == 35 * GB
    assert plan["kv_budget_bytes_per_rank"] == 40 * GB
    assert plan["replica_kv_bytes"] == 160 * GB
    assert plan["token_capacity"] == 488_281
    assert plan["concurrency_at_context"] == 61  # 8,000-token conversations
    assert plan["mean_resident_tokens"] == 3175
    assert plan["decode_residency_s"] == pytest.approx(15.75)
    assert plan["concurrent_requests_at_peak"] == pytest.approx(6300)
    assert plan["kv_required_at_peak_bytes"] / 2**40 == pytest.approx(5.96, abs=0.005)
    assert plan["replicas_for_peak"] == 41
    assert plan["p99_to_mean_prompt"] == 8.0
    assert plan["concurrency_at_p99"] == 488_281 // 24_175


def test_the_table_names_each_step() -> None:
    out = CliRunner().invoke(main, EXAMPLE)
    assert out.exit_code == 0, out.output
    lines = dict(line.split("  ", 1) for line in out.output.splitlines())
    table = {k.strip(): v.strip() for k, v in lines.items()}
    assert table["KV bytes per token (fp16)"] == "327,680 B"
    assert table["resident token capacity"] == "488,281 tokens"
    assert table["replicas for the peak (memory)"] == "41"
    assert table["KV required at peak"] == "5.96 TiB"


def test_the_bundled_model_from_its_own_file() -> None:
    arch = read_model_architecture(default_model_path())
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (30, 3, 64)
    # SmolLM2-135M: about 135 million weights, embeddings tied.
    assert 130e6 < count_parameters(arch) < 140e6
    out = CliRunner().invoke(
        main,
        ["capacity", "--model", default_model_path(), "--kv-dtype", "fp32",
         "--weight-dtype", "fp32", "--device-memory-gb", "8", "--mean-prompt", "200",
         "--mean-output", "64", "--itl-ms", "40", "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    assert plan["kv_bytes_per_token"] == 2 * 30 * 3 * 64 * 4
    assert plan["weight_bytes_per_rank"] == count_parameters(arch) * 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "80", "--kv-heads", "8"], "give --model, or all of"),
        (["--layers", "-1", "--kv-heads", "8", "--head-dim", "128", "--weights-gb", "1"],
         "layers must be positive"),
        (["--model", "/nonexistent/model.gguf"], "neither a model file nor a folder"),
        (["--layers", "80", "--kv-heads", "8", "--head-dim", "128"], "give the weights"),
        (["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--weights-gb", "1000"],
         "no room for a KV cache"),
        (["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--weights-gb", "nan"],
         "must be a finite number above 0"),
        (["--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--itl-ms", "inf"],
         "must be a finite number above 0"),
    ],
)  # fmt: skip
def test_bad_inputs_are_one_line_errors(args: list[str], message: str) -> None:
    base = ["capacity", "--device-memory-gb", "80", "--mean-prompt", "100"]
    out = CliRunner().invoke(main, [*base, "--mean-output", "10", "--itl-ms", "20", *args])
    assert out.exit_code != 0
    assert message in out.output
    assert "Traceback" not in out.output


def test_library_checks_its_inputs() -> None:
    shape = ModelShape(2, 2, 64, 1000)
    hardware = Hardware(device_memory_bytes=GB)
    with pytest.raises(CapacityInputError, match="p99 prompt length is below"):
        plan_capacity(shape, hardware, Workload(100, 10, 0.02, p99_prompt_tokens=50))
    with pytest.raises(CapacityInputError, match="inter-token latency"):
        plan_capacity(shape, hardware, Workload(100, 10, math.inf))


def test_a_mixture_of_experts_counts_all_weights_but_names_the_active_ones(
    tmp_path: Path,
) -> None:
    from tests.utils.hf_families import make_family_dir

    folder = make_family_dir(tmp_path, "mixtral", seed=1)  # 4 experts, top 2
    arch = read_model_architecture(folder)
    args = ["capacity", "--model", str(folder), "--device-memory-gb", "8",
            "--mean-prompt", "100", "--mean-output", "50", "--itl-ms", "30"]  # fmt: skip
    plan = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert plan["num_params"] == count_parameters(arch)
    assert plan["weight_bytes_per_rank"] == count_parameters(arch) * 2  # fp16, all experts
    # Two of the four experts idle per token, in each of the two layers.
    expert = 3 * arch.hidden_size * arch.moe_intermediate_size
    assert plan["active_params"] == plan["num_params"] - 2 * 2 * expert
    text = CliRunner().invoke(main, args).output
    assert f"({plan['active_params']:,} active per token)" in text


def test_the_worksheet_refuses_a_context_past_the_models(tmp_path: Path) -> None:
    from tests.utils.hf_families import make_family_dir

    folder = make_family_dir(tmp_path, "mistral", seed=1, sliding_window=512)
    args = ["capacity", "--model", str(folder), "--device-memory-gb", "8",
            "--mean-prompt", "100", "--mean-output", "50", "--itl-ms", "30"]  # fmt: skip
    plan = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert plan["context_limit"] == 2048  # the model's, not its window
    refused = CliRunner().invoke(main, [*args, "--context-tokens", "4096"])
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "4096 exceed the model's longest context, 2048 tokens" in refused.output


def test_a_window_on_every_layer_bounds_what_a_request_holds(tmp_path: Path) -> None:
    """Mistral v0.1's shape: each request holds at most its last W tokens' KV, so
    concurrency at a long context is the capacity over W; Gemma 2's shape (full layers
    between the window ones) keeps every token."""
    from tests.utils.hf_families import make_family_dir

    args = ["capacity", "--device-memory-gb", "8", "--mean-prompt", "1500",
            "--mean-output", "100", "--itl-ms", "30", "--context-tokens", "2048"]  # fmt: skip
    windowed = make_family_dir(tmp_path, "mistral", seed=1, sliding_window=512)
    plan = json.loads(CliRunner().invoke(main, [*args, "--model", str(windowed), "--json"]).output)
    assert plan["kv_window"] == 512
    assert plan["mean_resident_tokens"] == 512
    assert plan["concurrency_at_context"] == plan["token_capacity"] // 512
    text = CliRunner().invoke(main, [*args, "--model", str(windowed)]).output
    assert "KV held per request, at most" in text and "512 tokens" in text
    mixed = make_family_dir(tmp_path, "gemma2", seed=1)
    plan = json.loads(CliRunner().invoke(main, [*args, "--model", str(mixed), "--json"]).output)
    assert plan["kv_window"] is None and plan["mean_resident_tokens"] == 1550
    assert plan["concurrency_at_context"] == plan["token_capacity"] // 2048
