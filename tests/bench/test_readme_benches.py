"""Every benchmark command in the README starts as written: `.venv/bin/python bench/X.py`.

Run as a script, Python puts bench/ on the path, not the project's root, so a benchmark
that imports the project's `tests` or `bench` packages must put the root there itself;
`bench/fleet.py` and `bench/multi_lora.py` did not, and stopped at their imports. One
child process runs each script's `--help` as `__main__` from an empty folder, as the
command would, with the path and the project's `tests`/`bench` modules reset between
scripts (so that no script gets by on what an earlier one imported), and without the
test run's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.utils.python_child import run_python

ROOT = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"\.venv/bin/python (bench/\w+\.py)")

RUN_EACH = """
import json, runpy, sys
base = list(sys.path[1:])
codes = {}
for script in sys.argv[1:]:
    sys.path[:] = [script.rsplit("/", 1)[0], *base]  # what `python script` starts with
    for name in [m for m in sys.modules if m.split(".")[0] in ("tests", "bench")]:
        del sys.modules[name]
    sys.argv = [script, "--help"]
    try:
        runpy.run_path(script, run_name="__main__")
        codes[script] = 0
    except SystemExit as exc:
        codes[script] = exc.code or 0
    except BaseException as exc:
        codes[script] = repr(exc)
print(json.dumps(codes))
"""


def readme_benches() -> list[str]:
    """The bench scripts the README tells a user to run, in order of first mention."""
    found = COMMAND.findall((ROOT / "README.md").read_text())
    return list(dict.fromkeys(found))


def test_the_readme_names_its_benchmarks() -> None:
    benches = readme_benches()
    assert {"bench/engine_hop.py", "bench/fleet.py", "bench/multi_lora.py"} <= set(benches)
    assert all((ROOT / b).is_file() for b in benches)


@pytest.mark.slow
def test_each_readme_benchmark_starts_as_a_script(tmp_path: Path) -> None:
    scripts = [str(ROOT / b) for b in readme_benches()]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = run_python(RUN_EACH, scripts, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    assert codes == {s: 0 for s in scripts}
