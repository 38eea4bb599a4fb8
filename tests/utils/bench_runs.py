"""Running a bench script's `main` in a test: its stdout captured to a file, its last
line parsed as the JSON report, and that report checked against what `main` returned."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def run_bench_main(
    main: Callable[[list[str]], Any], argv: Sequence[str], capture: Path
) -> tuple[dict[str, Any], list[str]]:
    """Runs `main(argv)` with stdout written to `capture`; returns (the JSON report on
    its last line, every stdout line). Asserts the report is what `main` returned."""
    with capture.open("w") as out, contextlib.redirect_stdout(out):
        returned = main(list(argv))
    lines = capture.read_text().strip().splitlines()
    report: dict[str, Any] = json.loads(lines[-1])
    assert report == json.loads(json.dumps(returned))
    return report, lines
