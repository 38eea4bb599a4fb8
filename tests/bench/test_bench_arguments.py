"""The bench scripts refuse bad arguments before any model loads, engine or server
starts: argparse's usage error (exit code 2) with a clear message on stderr."""

from __future__ import annotations

import importlib

import pytest

# bench module -> {its arguments (split on spaces): a part of the message on stderr}
REFUSALS: dict[str, dict[str, str]] = {
    "bench.cpu_linear": {
        "--batches two": "--batches: 'two' is not a comma-separated list",
        "--batches 1,,2": "is not a comma-separated list",
        "--batches 0": "every batch must be between 1 and 256",
        "--batches 1,999": "every batch must be between 1 and 256",
        "--output-tokens 1": "--output-tokens: must be at least 2, not 1",
    },
    "bench.kv_tiers": {
        "--workload medium": "invalid choice: 'medium'",
        "--short-tenants 0": "--short-tenants: must be at least 1, not 0",
        "--short-prefix-blocks two": "--short-prefix-blocks: 'two' is not a whole number",
    },
    "bench.model_families": {
        "--families gpt2": "--families: unknown gpt2; known: llama, qwen2",
        "--batches one": "--batches: 'one' is not a comma-separated list",
        "--batches 0,8": "every value must be between 1 and 64",
        "--new-tokens 1": "--new-tokens: must be between 2 and 1024, not 1",
        "--threads 0": "--threads: must be between 1 and 256, not 0",
        "--shape huge": "invalid choice: 'huge'",
    },
    "bench.noisy_neighbour": {
        "--requests 0": "--requests: must be at least 1, not 0",
        "--requests -2": "--requests: must be at least 1, not -2",
        "--requests many": "--requests: 'many' is not a whole number",
        "--attacker-concurrency 2": "--attacker-concurrency: must be at least 3",
        "--request-timeout-s 0": "--request-timeout-s: must be a positive number",
        "--sides during": "--sides: sides are before and/or after",
        "--flood-prompt-tokens 5000": "flood_prompt_tokens must be below the pool",
    },
    "bench.overlap": {
        "--batch 8,,32": "--batch: '8,,32' is not a comma-separated list",
        "--batch 0": "every batch must be between 1 and 512",
        "--output-tokens 1": "--output-tokens: must be at least 2, not 1",
        "--repeats 0": "--repeats: must be at least 1, not 0",
        "--workloads fake-fast": "--workloads: unknown fake-fast; known:",
        "--workloads model": "--workloads model needs --model PATH",
        "--device tpu": "invalid choice: 'tpu'",
    },
    "bench.speculative": {
        "--k 0": "--k must be positive",
        "--requests 0": "--requests must be positive",
        "--new-tokens -1": "--new-tokens must be positive",
        "--concurrency 1,0": "--concurrency must be positive",
        "--concurrency one": "--concurrency must be comma-separated integers",
        "--workloads grounded,poetry": "--workloads are grounded and/or open",
    },
    "bench.traffic_classes": {
        "--seconds 0": "--seconds must be positive",
        "--concurrency -1": "--concurrency must be positive",
        "--batch-lines 0": "--batch-lines must be positive",
        "--new-tokens 0": "--new-tokens must be positive",
    },
}


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        pytest.param(module, args, message, id=f"{module}:{args}")
        for module, refusals in REFUSALS.items()
        for args, message in refusals.items()
    ],
)
def test_bad_arguments_are_refused_with_a_clear_message(
    module: str, args: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_info:
        main(args.split())
    assert exit_info.value.code == 2  # argparse's usage error, before anything starts
    assert message in capsys.readouterr().err
