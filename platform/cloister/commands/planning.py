"""`cloister capacity` and `cloister reuse-replay`: sizing before serving.

`capacity` fills in the KV-cache capacity worksheet from a model's own shape;
`reuse-replay` measures the token-weighted prefix-reuse fraction of a traffic sample,
within tenants and in one shared domain, and optionally against the real engine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

GB = 1_000_000_000  # the worksheet uses decimal bytes, as the serving guide's example does
TIB = 2**40


class FiniteFloat(click.ParamType[float]):
    """A float that is finite and at least `low` (above it when `strict`); NaN is refused."""

    name = "number"

    def __init__(self, low: float = 0.0, *, strict: bool = True) -> None:
        self.low, self.strict = low, strict

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """The float, or a usage error naming the option."""
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        below = number <= self.low if self.strict else number < self.low
        if not math.isfinite(number) or below:
            bound = "above" if self.strict else "at least"
            self.fail(f"{value!r} must be a finite number {bound} {self.low:g}", param, ctx)
        return number


POSITIVE = FiniteFloat()
NON_NEGATIVE = FiniteFloat(strict=False)


def _fail(exc: Exception) -> click.ClickException:
    return click.ClickException(str(getattr(exc, "message", exc)))


@click.command("capacity")
@click.option("--model", "model_path", help="A GGUF file, a model folder or a config.json.")
@click.option("--layers", type=int, help="Attention layers (overrides the model's).")
@click.option("--kv-heads", type=int, help="KV heads (overrides the model's).")
@click.option("--head-dim", type=int, help="Head dimension (overrides the model's).")
@click.option("--kv-dtype", type=click.Choice(["fp32", "bf16", "fp16", "fp8"]), default="fp16")
@click.option("--weight-dtype", type=click.Choice(["fp32", "bf16", "fp16", "fp8"]), default="fp16")
@click.option("--weights-gb", type=POSITIVE, help="Weights of all ranks, GB (default: counted).")
@click.option("--device-memory-gb", type=POSITIVE, required=True, help="Usable memory per rank.")
@click.option("--ranks", type=int, default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--overhead-gb", type=NON_NEGATIVE, default=0.0, show_default=True, help="Per rank.")
@click.option("--mean-prompt", type=int, required=True, help="Mean prompt tokens.")
@click.option("--p99-prompt", type=int, help="p99 prompt tokens (tail headroom).")
@click.option("--mean-output", type=int, required=True, help="Mean output tokens.")
@click.option("--itl-ms", type=POSITIVE, required=True, help="Measured mean inter-token latency.")
@click.option("--peak-rps", type=POSITIVE, help="Peak arrival rate, requests per second.")
@click.option("--context-tokens", type=int, help="Also give concurrency at this length.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def capacity(
    model_path: str | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    kv_dtype: str,
    weight_dtype: str,
    weights_gb: float | None,
    device_memory_gb: float,
    ranks: int,
    overhead_gb: float,
    mean_prompt: int,
    p99_prompt: int | None,
    mean_output: int,
    itl_ms: float,
    peak_rps: float | None,
    context_tokens: int | None,
    as_json: bool,
) -> None:
    """The KV capacity worksheet: bytes per token, budget, concurrency, replicas."""
    from engine.errors import EngineError
    from engine.planning.capacity import Hardware, ModelShape, Workload, plan_capacity
    from engine.planning.model_source import read_model_architecture

    try:
        if model_path is not None:
            shape = ModelShape.from_architecture(read_model_architecture(model_path))
        elif None in (layers, kv_heads, head_dim):
            raise click.UsageError("give --model, or all of --layers, --kv-heads and --head-dim")
        else:
            shape = ModelShape(0, 0, 0)
        shape = ModelShape(
            layers or shape.num_layers,
            kv_heads or shape.num_kv_heads,
            head_dim or shape.head_dim,
            shape.num_params,
            shape.active_params,
            shape.context_limit,
        )
        plan = plan_capacity(
            shape,
            Hardware(
                device_memory_bytes=int(device_memory_gb * GB),
                ranks=ranks,
                weight_bytes=None if weights_gb is None else int(weights_gb * GB),
                overhead_bytes_per_rank=int(overhead_gb * GB),
            ),
            Workload(
                mean_prompt_tokens=mean_prompt,
                mean_output_tokens=mean_output,
                itl_s=itl_ms / 1000.0,
                p99_prompt_tokens=p99_prompt,
                peak_rps=peak_rps,
                context_tokens=context_tokens,
            ),
            kv_dtype=kv_dtype,
            weight_dtype=weight_dtype,
        )
    except EngineError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(plan.to_dict(), sort_keys=True))
        return
    click.echo(_table(_capacity_rows(plan, kv_dtype)))


def _capacity_rows(plan: Any, kv_dtype: str) -> list[tuple[str, str]]:
    by_dtype = ", ".join(f"{d} {b:,}" for d, b in plan.kv_bytes_per_token_by_dtype.items())
    rows = [
        (f"KV bytes per token ({kv_dtype})", f"{plan.kv_bytes_per_token:,} B"),
        ("KV bytes per token by dtype", by_dtype),
        ("weights per rank", f"{plan.weight_bytes_per_rank / GB:,.2f} GB"),
    ]
    if plan.num_params is not None:
        active = plan.active_params
        rows.append(
            (
                "parameters",
                f"{plan.num_params:,}"
                + ("" if active in (None, plan.num_params) else f" ({active:,} active per token)"),
            )
        )
    if plan.context_limit is not None:
        rows.append(("model context", f"{plan.context_limit:,} tokens"))
    rows += [
        ("KV budget per rank", f"{plan.kv_budget_bytes_per_rank / GB:,.2f} GB"),
        ("replica KV", f"{plan.replica_kv_bytes / GB:,.2f} GB"),
        ("resident token capacity", f"{plan.token_capacity:,} tokens"),
        ("mean resident tokens per request", f"{plan.mean_resident_tokens:,.0f}"),
        ("concurrency at the mean", f"{plan.concurrency_at_mean:,} requests"),
    ]
    if plan.concurrency_at_context is not None:
        rows.append(("concurrency at --context-tokens", f"{plan.concurrency_at_context:,}"))
    rows.append(("decode residency (Little's law)", f"{plan.decode_residency_s:,.2f} s"))
    if plan.concurrent_requests_at_peak is not None:
        rows += [
            ("concurrent requests at peak", f"{plan.concurrent_requests_at_peak:,.0f}"),
            ("KV required at peak", f"{plan.kv_required_at_peak_bytes / TIB:,.2f} TiB"),
            ("replicas for the peak (memory)", f"{plan.replicas_for_peak:,}"),
        ]
    if plan.p99_to_mean_prompt is not None:
        rows += [
            ("p99 / mean prompt", f"{plan.p99_to_mean_prompt:,.1f}x"),
            ("concurrency at the p99 prompt", f"{plan.concurrency_at_p99:,} requests"),
        ]
        if plan.replicas_for_peak_at_p99 is not None:
            rows.append(("replicas if every prompt were p99", f"{plan.replicas_for_peak_at_p99:,}"))
    return rows


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


@click.command("reuse-replay")
@click.argument("sample", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--model", "model_path", help="Tokenizes text prompts; the engine's model.")
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--window-s", type=POSITIVE, help="Blocks stay eligible this long after last use.")
@click.option("--kv-budget-tokens", type=int, help="Blocks beyond this are evicted, LRU.")
@click.option("--engine", "on_engine", is_flag=True, help="Also replay through the engine.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def reuse_replay(
    sample: Path,
    model_path: str | None,
    block_size: int,
    window_s: float | None,
    kv_budget_tokens: int | None,
    on_engine: bool,
    as_json: bool,
) -> None:
    """The token-weighted prefix-reuse fraction of a JSONL traffic sample.

    Each line: {"tenant": ..., "timestamp": seconds or ISO 8601, "token_ids": [...]}
    or "prompt": text. Reports the upper bound within tenants and in one shared
    domain; --engine adds the hit rate the engine observes on the same sample.
    """
    from engine.errors import EngineError
    from engine.model.loader import default_model_path
    from engine.model.tokenizer import load_tokenizer
    from engine.planning.reuse import read_sample, replay_reuse

    model = model_path or default_model_path()
    try:
        tokenizer: Any = None

        def encode(text: str) -> list[int]:
            nonlocal tokenizer
            if tokenizer is None:
                tokenizer = load_tokenizer(model)
            ids: list[int] = tokenizer.encode(text)
            return ids

        records = read_sample(sample, encode)
        options: dict[str, Any] = {
            "block_size": block_size,
            "window_s": window_s,
            "kv_budget_tokens": kv_budget_tokens,
        }
        result: dict[str, Any] = {
            "block_size": block_size,
            "window_s": window_s,
            "kv_budget_tokens": kv_budget_tokens,
            "within_tenants": replay_reuse(records, isolated=True, **options).to_dict(),
            "shared_domain": replay_reuse(records, isolated=False, **options).to_dict(),
        }
        if on_engine:
            result["engine"] = _engine_replay(model, records, block_size, kv_budget_tokens)
    except EngineError as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps(result, sort_keys=True))
        return
    rows = [
        ("requests", f"{result['within_tenants']['requests']:,}"),
        ("prompt tokens", f"{result['within_tenants']['input_tokens']:,}"),
        ("reuse bound, within tenants", f"{result['within_tenants']['reuse_fraction']:.3f}"),
        ("reuse bound, one shared domain", f"{result['shared_domain']['reuse_fraction']:.3f}"),
    ]
    if on_engine:
        rows.append(("engine hit rate, within tenants", f"{result['engine']['hit_rate']:.3f}"))
        rows.append(("engine / bound", f"{result['engine']['vs_bound']:.3f}"))
    click.echo(_table(rows))


def _engine_replay(
    model: str, records: Any, block_size: int, kv_budget_tokens: int | None
) -> dict[str, Any]:
    from engine.llm import LLM
    from engine.planning.engine_replay import replay_on_engine
    from engine.planning.reuse import replay_reuse

    options: dict[str, Any] = {"block_size": block_size}
    if kv_budget_tokens is not None:
        options["num_blocks"] = max(1, kv_budget_tokens // block_size)
    longest = max(len(r.token_ids) for r in records)
    llm = LLM(model, max_model_len=max(longest + 1, 256), **options)
    observed = replay_on_engine(llm, records, isolated=True, progress=True)
    bound = replay_reuse(
        records, block_size=block_size, isolated=True, kv_budget_tokens=kv_budget_tokens
    )
    return {
        **observed.to_dict(),
        "hit_rate": observed.reuse_fraction,
        "vs_bound": observed.reuse_fraction / bound.reuse_fraction if bound.shared_tokens else 1.0,
    }


commands = [capacity, reuse_replay]
