"""Running a snippet of Python in a child process of this interpreter (stdlib only, so
that the kernel tests can use it on the GPU image)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_python(
    code: str, args: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """Runs `python -c code *args` with this interpreter in `cwd` and `env`; returns the
    finished process with its stdout and stderr as text (raises on `timeout` seconds)."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
