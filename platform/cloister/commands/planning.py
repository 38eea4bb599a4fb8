"""`cloister capacity` and `cloister reuse-replay`: sizing before serving.

`capacity` fills in the KV-cache capacity worksheet from a model's own shape;
`reuse-replay` measures the token-weighted prefix-reuse fraction of a traffic sample,
within tenants and in one shared domain, and optionally against the real engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
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


class ByteCount(click.ParamType[int]):
    """A whole number of bytes, 0 or more (as `serve`'s kv_*_bytes settings take them)."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The integer, or a usage error naming the option (exit code 2)."""
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a whole number of bytes", param, ctx)
        if number < 0:
            self.fail(f"{value!r} must be 0 or more bytes", param, ctx)
        return number


BYTES = ByteCount()


@dataclass(frozen=True)
class TierCapacity:
    """What one KV tier under the device pool holds, sized as the engine sizes it
    (engine/kv_cache/host_setup.py): whole blocks of `block_size` tokens in the budget."""

    medium: str  # the tier's medium, as on /metrics ("CPU_HOST" for L2, "DISK" for L3)
    budget_bytes: int
    bytes_per_block: int  # what one block takes in this tier (a disk file has a header)
    block_size: int

    @property
    def num_blocks(self) -> int:
        """Blocks the budget holds (0: the engine leaves the tier off, with a warning)."""
        return self.budget_bytes // self.bytes_per_block

    @property
    def num_tokens(self) -> int:
        """Tokens those blocks hold."""
        return self.num_blocks * self.block_size

    def to_dict(self) -> dict[str, object]:
        """JSON-ready values, the derived ones included."""
        return {
            "medium": self.medium,
            "budget_bytes": self.budget_bytes,
            "bytes_per_block": self.bytes_per_block,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "token_capacity": self.num_tokens,
        }


def tier_capacities(
    kv_bytes_per_token: int, block_size: int, host_bytes: int, disk_bytes: int
) -> list[TierCapacity]:
    """The L2 (host memory) and L3 (disk) tiers a replica with these budgets gets; a
    budget of 0 is a tier that is off (left out).

    A block in host memory is the device block's bytes (K and V of `block_size` tokens
    over every layer, `engine.kv_cache.sizing.bytes_per_block`); a block on disk is a
    file of those bytes plus its header and digest, as the engine counts it against
    kv_disk_bytes.
    """
    from engine.kv_cache.host_setup import disk_file_bytes  # the engine's own rule, not a copy

    per_block = kv_bytes_per_token * block_size
    tiers: list[TierCapacity] = []
    if host_bytes > 0:
        tiers.append(TierCapacity("CPU_HOST", host_bytes, per_block, block_size))
    if disk_bytes > 0:
        per_file = disk_file_bytes(per_block, block_size)
        tiers.append(TierCapacity("DISK", disk_bytes, per_file, block_size))
    return tiers


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
# The tiers' inputs also come from the environment variables `cloister serve` reads, so
# that the worksheet of a configured host shows the tiers it would get without repeating
# them; a flag wins over the environment.
@click.option(
    "--block-size",
    type=click.IntRange(min=1, max=1024),
    default=16,
    show_default=True,
    envvar="CLOISTER_BLOCK_SIZE",
    help="KV block size in tokens (serve's block_size), for the tiers' whole blocks.",
)
@click.option(
    "--kv-host-bytes",
    type=BYTES,
    default=0,
    envvar="CLOISTER_KV_HOST_BYTES",
    help="Host-memory KV tier (L2) budget per replica, bytes (0: off).",
)
@click.option(
    "--kv-disk-bytes",
    type=BYTES,
    default=0,
    envvar="CLOISTER_KV_DISK_BYTES",
    help="Local-disk KV tier (L3) budget per replica, bytes (0: off; needs L2).",
)
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
    block_size: int,
    kv_host_bytes: int,
    kv_disk_bytes: int,
    as_json: bool,
) -> None:
    """The KV capacity worksheet: bytes per token, budget, concurrency, replicas, and
    the token capacity of the KV tiers under the device pool (--kv-host-bytes,
    --kv-disk-bytes)."""
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
            shape.kv_window,
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
    if kv_disk_bytes > 0 and kv_host_bytes == 0:
        # The engine refuses this too (CacheConfig): the disk tier sits under the host tier.
        raise click.UsageError("--kv-disk-bytes needs --kv-host-bytes: L3 sits under L2")
    tiers = tier_capacities(plan.kv_bytes_per_token, block_size, kv_host_bytes, kv_disk_bytes)
    if as_json:
        result = plan.to_dict()
        if tiers:
            result["block_size"] = block_size
            result["kv_tiers"] = [t.to_dict() for t in tiers]
        click.echo(json.dumps(result, sort_keys=True))
        return
    click.echo(_table(_capacity_rows(plan, kv_dtype, tiers)))


_TIER_NAMES = {"CPU_HOST": "L2 host memory", "DISK": "L3 disk"}


def _tier_rows(plan: Any, tiers: list[TierCapacity]) -> list[tuple[str, str]]:
    """One row per tier, after the device pool's figures it is compared with."""
    rows: list[tuple[str, str]] = []
    for t in tiers:
        name = f"{_TIER_NAMES.get(t.medium, t.medium)} token capacity"
        if t.num_blocks == 0:
            rows.append(
                (name, f"0 tokens: {t.budget_bytes:,} B holds no {t.bytes_per_block:,}-byte block")
            )
            continue
        vs_device = t.num_tokens / plan.token_capacity if plan.token_capacity else 0.0
        rows.append(
            (
                name,
                f"{t.num_tokens:,} tokens ({t.num_blocks:,} blocks x {t.block_size} tokens, "
                f"{t.bytes_per_block:,} B each; {vs_device:,.2f}x the device pool)",
            )
        )
    return rows


def _capacity_rows(
    plan: Any, kv_dtype: str, tiers: list[TierCapacity] | None = None
) -> list[tuple[str, str]]:
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
    if plan.kv_window is not None:
        held = f"{plan.kv_window:,} tokens (a window on every layer; blocks behind it freed)"
        rows.append(("KV held per request, at most", held))
    rows += [
        ("KV budget per rank", f"{plan.kv_budget_bytes_per_rank / GB:,.2f} GB"),
        ("replica KV", f"{plan.replica_kv_bytes / GB:,.2f} GB"),
        ("resident token capacity", f"{plan.token_capacity:,} tokens"),
        *_tier_rows(plan, tiers or []),  # next to the device pool's figure they extend
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
