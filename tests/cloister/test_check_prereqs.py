"""scripts/check_prereqs: one clear line per missing prerequisite, exit 1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_prereqs"


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash") or "/bin/bash"
    return subprocess.run(
        [bash, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30
    )


def test_unreachable_services_are_named_with_what_to_start() -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DATABASE_URL": "postgresql+psycopg://u:pw@127.0.0.1:1/x",
        "REDIS_URL": "redis://127.0.0.1:2/0",
    }
    res = run(env, "--services")
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert len(lines) == 2, res.stderr
    assert "PostgreSQL is not reachable at 127.0.0.1:1" in lines[0] and "docker run" in lines[0]
    assert "Redis is not reachable at 127.0.0.1:2" in lines[1] and "pw" not in res.stderr


def test_missing_node_and_npm_say_what_to_install(tmp_path: Path) -> None:
    # A PATH with nothing on it: the interpreter is given by its full path.
    env = {"PATH": str(tmp_path), "PYTHON": sys.executable}
    res = run(env)
    assert res.returncode == 1
    lines = res.stderr.splitlines()
    assert [line.split(":")[1].strip().split()[0] for line in lines] == ["node", "npm"], lines
    assert all("install Node.js" in line for line in lines)


def test_all_present_is_silent() -> None:
    if not (shutil.which("node") and shutil.which("npm")):
        raise AssertionError("node and npm are prerequisites of this repository's tests")
    res = run({**os.environ, "PYTHON": sys.executable})
    assert res.returncode == 0 and res.stderr == ""
