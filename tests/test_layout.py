"""The repository layout keeps the standard library's `platform` module importable."""

import ast
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
    for name in (
        "engine",
        "tenancy",
        "cloister",
        "server",
        "gateway",
        "admin",
        "engine_server",
        "engine_hop",
    ):
        assert importlib.import_module(name) is not None


def imported_roots(package: pathlib.Path) -> set[str]:
    """Top-level names every module under `package` imports (lazy imports included)."""
    roots: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                roots.add(node.module.split(".")[0])
    return roots


def test_imports_go_one_way() -> None:
    """The services never import the CLI; tenancy never imports the services; the engine
    imports none of them (it runs alone on a GPU image); the hop's shared part imports
    only the engine, so that both ends of the hop may import it."""
    services = {"cloister", "server", "gateway", "admin", "engine_server", "engine_hop"}
    assert "cloister" not in imported_roots(ROOT / "platform" / "gateway")
    assert "cloister" not in imported_roots(ROOT / "platform" / "admin")
    assert "cloister" not in imported_roots(ROOT / "platform" / "server")
    # The engine server knows nothing of tenants: it gets an opaque domain and fairness key.
    engine_side = imported_roots(ROOT / "platform" / "engine_server")
    assert not engine_side & {"cloister", "server", "gateway", "admin", "tenancy"}
    # The hop's shared part (the refusal table) stands under both ends of the hop.
    hop = imported_roots(ROOT / "platform" / "engine_hop")
    assert not hop & {"cloister", "server", "gateway", "admin", "engine_server", "tenancy"}
    assert not imported_roots(ROOT / "tenancy") & services
    assert not imported_roots(ROOT / "engine") & (services | {"tenancy"})
