"""The engine's flags, shared by `cloister serve` and `cloister engine serve`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# Each maps to the Settings field of the same name (None: the setting's own value).
ENGINE_OPTIONS: tuple[Callable[[Any], Any], ...] = (
    click.option("--max-model-len", type=int, default=None, help="Context length cap."),
    click.option("--kv-cache-bytes", type=int, default=None, help="KV pool size in bytes."),
    click.option(
        "--kv-host-bytes",
        type=int,
        default=None,
        help="Host-memory KV tier under the pool, in bytes (default 0: off).",
    ),
    click.option(
        "--kv-disk-path",
        default=None,
        help="Directory of the local-disk KV tier (L3) under the host tier (default: off).",
    ),
    click.option(
        "--kv-disk-bytes",
        type=int,
        default=None,
        help="Budget of the disk KV tier in bytes (default 0: off; needs --kv-host-bytes).",
    ),
    click.option(
        "--speculative-method",
        type=click.Choice(["off", "ngram", "draft"]),
        default=None,
        help="Speculative decoding: off (default), ngram (draft tokens looked up in the "
        "request's own tokens) or draft (a small draft model, --speculative-model); drafts "
        "are verified in one pass, so greedy output is unchanged.",
    ),
    click.option(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="Draft tokens proposed per sequence and step at most, 1 to 16 (default 4).",
    ),
    click.option(
        "--speculative-model",
        default=None,
        help="The draft model of --speculative-method draft (a folder or GGUF file with "
        "the served model's tokenizer).",
    ),
    click.option(
        "--speculative-max-batch",
        type=int,
        default=None,
        help="Running sequences above which no step speculates (default: from measured "
        "step costs).",
    ),
    click.option(
        "--engine-mode",
        type=click.Choice(["thread", "process"]),
        default=None,
        help="Run the engine loop on a thread of this process (default) or in a child process.",
    ),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None),
    click.option(
        "--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default=None
    ),
    click.option(
        "--weight-quant",
        type=click.Choice(["auto", "none", "int8", "int4"]),
        default=None,
        help="Weight-only int8/int4 linears, CPU only (default none; auto: int4 for a Q4 "
        "GGUF, int8 for Q5/Q6/Q8, none for float checkpoints and on CUDA).",
    ),
    click.option(
        "--attention-backend", type=click.Choice(["auto", "torch", "cpu", "triton"]), default=None
    ),
    click.option(
        "--fused-ops",
        type=click.Choice(["auto", "on", "off"]),
        default=None,
        help="Fused triton kernels for norms, rotary and SiLU (auto: on CUDA only).",
    ),
    click.option("--prefix-cache", type=click.Choice(["hash", "radix", "off"]), default=None),
    click.option(
        "--scheduling-policy",
        type=click.Choice(["fair_lpm", "fair", "lpm", "fcfs"]),
        default=None,
        help="fair_lpm (default): fair across tenants, longest prefix match within one.",
    ),
    click.option("--max-num-seqs", type=int, default=None, help="Most sequences running at once."),
    click.option(
        "--max-loras", type=int, default=None, help="LoRA adapters on the device at once."
    ),
    click.option(
        "--max-cpu-loras", type=int, default=None, help="LoRA weights kept in host memory."
    ),
    click.option("--max-lora-rank", type=int, default=None, help="The largest LoRA rank accepted."),
    click.option(
        "--lora-slot-quantum",
        type=int,
        default=None,
        help="Steps an adapter keeps its slot before one that waits gets a turn.",
    ),
    click.option("--max-num-batched-tokens", type=int, default=None, help="Token budget per step."),
    click.option(
        "--prefill-chunk-size",
        type=int,
        default=None,
        help="Most prompt tokens per sequence a step.",
    ),
    click.option(
        "--itl-budget-ms",
        default=None,
        help="Inter-token latency budget (default 200): caps each step's prompt tokens from "
        "measured step costs; 'off' for the token budget alone.",
    ),
    click.option(
        "--kv-events-endpoint",
        default=None,
        help="Publish KV-cache events (vLLM's ZeroMQ format, for llm-d): tcp://*:PORT binds, "
        "tcp://HOST:PORT connects to a subscriber.",
    ),
    click.option(
        "--kv-events-topic",
        default=None,
        help="Topic of the KV events (default kv@<host>@<model>).",
    ),
    click.option(
        "--kv-events-replay-endpoint",
        default=None,
        help="Bind a replay socket here (tcp://*:PORT or ipc://path): subscribers that "
        "missed KV events ask for them again, as from vLLM's.",
    ),
    click.option(
        "--kv-events-buffer-steps",
        type=int,
        default=None,
        help="KV event batches kept for replay (default 10000).",
    ),
    click.option("--max-waiting", type=int, default=None, help="Waiting-queue slots (shared)."),
    click.option("--block-size", type=int, default=None, help="Tokens per KV block."),
    click.option(
        "--gpu-memory-utilization", type=float, default=None, help="CUDA: share of the GPU to use."
    ),
    click.option("--retention-ttl-s", type=float, default=None, help="Drop idle cached blocks."),
    click.option("--scrub-freed-blocks/--no-scrub-freed-blocks", default=None),
    click.option("--strict-partition/--no-strict-partition", default=None),
    click.option(
        "--overlap/--no-overlap",
        "overlap_scheduling",
        default=None,
        help="Overlap scheduling: the next step is prepared while the current one runs "
        "(default on; --no-overlap runs every step in turn).",
    ),
)


def engine_options(command: F) -> F:
    """Adds every engine flag to `command`."""
    for option in reversed(ENGINE_OPTIONS):
        command = option(command)
    return command
