"""scripts/test refuses a bad CLOISTER_TEST_WORKERS before it starts anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test"


def run(tmp_path: Path, workers: str) -> subprocess.CompletedProcess[str]:
    # A copy alone in an empty tree: once past the check it fails at once (no
    # scripts/bootstrap there) instead of starting the suite inside the suite.
    (tmp_path / "scripts").mkdir(exist_ok=True)
    script = tmp_path / "scripts" / "test"
    shutil.copy(SCRIPT, script)
    bash = shutil.which("bash") or "/bin/bash"
    env = {**os.environ, "CLOISTER_TEST_WORKERS": workers}
    return subprocess.run([bash, str(script)], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("workers", ["abc", "0", "-1", "1 2", "2.5", "99999", "1;true"])
def test_a_bad_worker_count_is_refused_by_name(tmp_path: Path, workers: str) -> None:
    res = run(tmp_path, workers)
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"test: CLOISTER_TEST_WORKERS must be a whole number from 1, not '{workers}'"
    )


@pytest.mark.parametrize("workers", ["1", "2", "16"])
def test_a_good_worker_count_passes_the_check(tmp_path: Path, workers: str) -> None:
    res = run(tmp_path, workers)
    assert "CLOISTER_TEST_WORKERS" not in res.stderr
    assert "scripts/bootstrap" in res.stderr  # the next step, missing from the copy
