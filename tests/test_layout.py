"""The repository layout: the standard library's `platform` stays importable, and imports
go one way (the services over tenancy over the engine; both ends of the hop over engine_hop)."""

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


def file_roots(path: pathlib.Path) -> set[str]:
    """Top-level names one module imports (lazy imports included)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def imported_roots(package: pathlib.Path) -> set[str]:
    """Top-level names every module under `package` imports (lazy imports included)."""
    roots: set[str] = set()
    for path in package.rglob("*.py"):
        roots |= file_roots(path)
    return roots


def test_imports_go_one_way() -> None:
    """The services never import the CLI; tenancy never imports the services; the engine
    imports none of them (it runs alone on a GPU image). The hop's rules are below."""
    services = {"cloister", "server", "gateway", "admin", "engine_server", "engine_hop"}
    assert "cloister" not in imported_roots(ROOT / "platform" / "gateway")
    assert "cloister" not in imported_roots(ROOT / "platform" / "admin")
    assert "cloister" not in imported_roots(ROOT / "platform" / "server")
    # The engine server knows nothing of tenants: it gets an opaque domain and fairness key.
    engine_side = imported_roots(ROOT / "platform" / "engine_server")
    assert not engine_side & {"cloister", "server", "gateway", "admin", "tenancy"}
    assert not imported_roots(ROOT / "tenancy") & services
    assert not imported_roots(ROOT / "engine") & (services | {"tenancy"})


def test_the_gateway_reaches_engine_servers_only_through_the_hop() -> None:
    """The gateway imports nothing of the engine server: what both ends of the hop share
    (the wire format, the refusal table, the stats JSON, the shared metrics, the link's
    path) is engine_hop's. Of the platform's other packages, only `cloister engine serve`
    imports the engine server, which it starts."""
    assert "engine_server" not in imported_roots(ROOT / "platform" / "gateway")
    importers = {
        path.relative_to(ROOT).as_posix()
        for package in ("gateway", "admin", "server", "cloister", "engine_hop")
        for path in (ROOT / "platform" / package).rglob("*.py")
        if "engine_server" in file_roots(path)
    }
    assert importers <= {"platform/cloister/commands/engine_serve.py"}


def test_the_hop_imports_no_service() -> None:
    """engine_hop stands under both ends of the hop: it imports neither end, nor any other
    service, nor tenancy (the engine server knows nothing of tenants)."""
    services = {"gateway", "server", "admin", "cloister", "tenancy", "engine_server"}
    assert not imported_roots(ROOT / "platform" / "engine_hop") & services
