"""`cloister bench serve`: the serving benchmark (see cloister.serve_bench)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cloister.commands.bench import bench


def _ints(value: str) -> list[int]:
    try:
        numbers = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"give comma-separated integers, got {value!r}") from None
    if any(n < 1 for n in numbers):
        raise click.BadParameter("every value must be at least 1")
    return numbers


def _shares(value: str) -> list[float]:
    try:
        shares = [float(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"give comma-separated fractions, got {value!r}") from None
    if any(not 0.0 <= s < 1.0 for s in shares):  # NaN fails this test too
        raise click.BadParameter("a prefix share is a fraction in [0, 1)")
    return shares


def _list_option(convert: Any) -> Any:
    return lambda _ctx, _param, value: convert(value)


@bench.command("serve")
@click.option("--base-url", required=True, help="The server, e.g. http://127.0.0.1:8000.")
@click.option("--model", required=True, help="The model name the server expects.")
@click.option("--api-key", "api_keys", multiple=True, help="One per tenant (repeatable).")
@click.option("--tenants", type=click.IntRange(1, 1024), help="Tenants (default: one per key).")
@click.option("--input-len", default="200", callback=_list_option(_ints), show_default=True)
@click.option("--output-len", default="64", callback=_list_option(_ints), show_default=True)
@click.option("--prefix-share", default="0", callback=_list_option(_shares), show_default=True)
@click.option("--turns", default="1", callback=_list_option(_ints), show_default=True)
@click.option("--concurrency", default="1,4,8", callback=_list_option(_ints), show_default=True)
@click.option("--duration-s", type=click.FloatRange(0.1, 86400), default=30.0, show_default=True)
@click.option("--warmup-s", type=click.FloatRange(0, 3600), default=5.0, show_default=True)
@click.option("--slo-ttft-ms", type=click.FloatRange(0, min_open=True), help="Goodput's TTFT.")
@click.option("--slo-tpot-ms", type=click.FloatRange(0, min_open=True), help="Goodput's TPOT.")
@click.option("--vocab", type=click.IntRange(200), default=49152, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--timeout-s", type=click.FloatRange(1, 3600), default=600.0, show_default=True)
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Frontier PNG.")
def serve_bench(
    base_url: str,
    model: str,
    api_keys: tuple[str, ...],
    tenants: int | None,
    input_len: list[int],
    output_len: list[int],
    prefix_share: list[float],
    turns: list[int],
    concurrency: list[int],
    duration_s: float,
    warmup_s: float,
    slo_ttft_ms: float | None,
    slo_tpot_ms: float | None,
    vocab: int,
    seed: int,
    timeout_s: float,
    json_out: Path | None,
    plot: Path | None,
) -> None:
    """Serving benchmark: the workload matrix at each concurrency, for a fixed duration.

    Sends streamed greedy completions of seeded random token ids to any
    OpenAI-compatible server (Cloister, vLLM, SGLang, llama.cpp's server). Prints a
    table per run and, last, one JSON line; --plot draws throughput against p95 TTFT
    and ITL (the frontier).
    """
    from tqdm import tqdm

    from cloister.serve_bench.client import CompletionClient
    from cloister.serve_bench.report import Slo, plot_frontier, summarize
    from cloister.serve_bench.runner import RunSpec, run_closed_loop
    from cloister.serve_bench.workload import matrix

    if (slo_ttft_ms is None) != (slo_tpot_ms is None):
        raise click.UsageError("give both --slo-ttft-ms and --slo-tpot-ms, or neither")
    slo = None if slo_ttft_ms is None or slo_tpot_ms is None else Slo(slo_ttft_ms, slo_tpot_ms)
    try:
        client = CompletionClient(base_url, model, list(api_keys), timeout_s)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--base-url") from None
    cells = matrix(input_len, output_len, prefix_share, turns)
    specs = [
        RunSpec(cell, c, warmup_s, duration_s, tenants or max(1, len(api_keys)), vocab, seed)
        for cell in cells
        for c in concurrency
    ]
    runs: list[dict[str, Any]] = []
    total = sum(s.warmup_s + s.duration_s for s in specs)
    with tqdm(total=round(total, 1), unit="s", desc="bench serve", leave=False) as bar:
        for spec in specs:
            bar.set_postfix_str(f"{spec.cell.name} c={spec.concurrency}")
            figures = summarize(run_closed_loop(client, spec, tick=bar.update), slo)
            runs.append(figures)
            bar.write(_line(figures))
    if plot is not None:
        plot_frontier(runs, plot)
    document = {"base_url": base_url, "model": model, "seed": seed, "runs": runs}
    line = json.dumps(document, sort_keys=True)
    if json_out is not None:
        json_out.write_text(line + "\n")
    click.echo(line)
    if not any(r["completed"] for r in runs):
        first = next((r["first_error"] for r in runs if r["first_error"]), "no request finished")
        raise click.ClickException(f"no request completed: {first}")


def _line(r: dict[str, Any]) -> str:
    text = (
        f"{r['workload']:<36} c={r['concurrency']:<4} ok={r['completed']:<5} "
        f"fail={r['failed']:<3} out_tok/s={r['output_throughput']:8.1f} "
        f"TTFT p50/p95={r['ttft_ms']['p50']:7.1f}/{r['ttft_ms']['p95']:7.1f} ms "
        f"ITL p50/p95={r['itl_ms']['p50']:6.1f}/{r['itl_ms']['p95']:6.1f} ms"
    )
    if "goodput" in r:
        text += f" goodput={r['goodput']:.2f} req/s"
    return text


commands: list[click.Command] = []  # registered on the `bench` group above
