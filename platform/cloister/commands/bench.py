"""`cloister bench kernels`: the GPU attention/engine benchmark (bench/gpu_decode.py).

The benchmark lives in the repository's bench/ folder (it is not part of the
installed packages), so this runs it as a script from the checkout, in a child
process, passing the options through; its exit status becomes ours.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

BENCH_SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_decode.py"


@click.group()
def bench() -> None:
    """Benchmarks (run from a source checkout)."""


@bench.command()
@click.option("--smoke", is_flag=True, help="Tiny sizes: checks the script on a CPU.")
@click.option(
    "--parts",
    default="kernels,parity,engine",
    show_default=True,
    help="Comma list of kernels, parity, engine.",
)
@click.option("--peak-tbps", default=4.8, show_default=True, type=float, help="HBM peak, TB/s.")
@click.option("--dtype", default=None, help="bfloat16 (CUDA default), float16 or float32.")
@click.option("--engine-budget-s", default=240.0, show_default=True, type=float)
@click.option("--json-out", default=None, type=click.Path(dir_okay=False, path_type=Path))
def kernels(
    smoke: bool,
    parts: str,
    peak_tbps: float,
    dtype: str | None,
    engine_budget_s: float,
    json_out: Path | None,
) -> None:
    """Triton attention vs SDPA, bf16 parity and engine decode/prefill tokens/s."""
    if not BENCH_SCRIPT.is_file():
        raise click.ClickException(f"{BENCH_SCRIPT} not found: run from a source checkout")
    argv = [
        sys.executable,
        str(BENCH_SCRIPT),
        "--parts",
        parts,
        "--peak-tbps",
        str(peak_tbps),
        "--engine-budget-s",
        str(engine_budget_s),
    ]
    if smoke:
        argv.append("--smoke")
    if dtype is not None:
        argv += ["--dtype", dtype]
    if json_out is not None:
        argv += ["--json-out", str(json_out)]
    code = subprocess.run(argv, check=False).returncode
    if code:
        raise SystemExit(code)


commands: list[click.Command] = [bench]
