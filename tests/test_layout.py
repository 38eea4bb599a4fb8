"""The repository layout keeps the standard library's `platform` module importable."""

import importlib
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_platform_folder_has_no_init() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_stdlib_platform_still_works_from_repo_root() -> None:
    # Run from the repository root, where `platform/` sits on sys.path[0].
    code = "import platform, sys; print(platform.system()); print(platform.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0] in {"Linux", "Darwin", "Windows"}
    assert not out[1].startswith(str(ROOT))


def test_platform_packages_import_by_their_own_names() -> None:
    for name in ("engine", "tenancy", "cloister", "gateway", "admin"):
        assert importlib.import_module(name) is not None
