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
        "assembly",
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
    services = {"cloister", "server", "gateway", "admin", "engine_server", "engine_hop", "assembly"}
    assert "cloister" not in imported_roots(ROOT / "platform" / "gateway")
    assert "cloister" not in imported_roots(ROOT / "platform" / "admin")
    assert "cloister" not in imported_roots(ROOT / "platform" / "server")
    # The engine server knows nothing of tenants: it gets an opaque domain and fairness key.
    engine_side = imported_roots(ROOT / "platform" / "engine_server")
    assert not engine_side & {"cloister", "server", "gateway", "admin", "tenancy"}
    assert not imported_roots(ROOT / "tenancy") & services
    assert not imported_roots(ROOT / "engine") & (services | {"tenancy"})


def test_server_has_two_floors() -> None:
    """The base floor (`server/`: settings, request ids, telemetry, logging, docs) stands
    under both services and imports none of them; the assembly floor (`assembly/`, how
    `cloister serve` puts them together) imports them, and only the CLI imports it."""
    above_base = {"gateway", "admin", "engine_server", "engine_hop", "assembly", "cloister"}
    assert not imported_roots(ROOT / "platform" / "server") & above_base
    for service in ("gateway", "admin", "engine_server", "engine_hop"):
        assert "assembly" not in imported_roots(ROOT / "platform" / service), service
    assert "cloister" not in imported_roots(ROOT / "platform" / "assembly")


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


def _reads_the_wire(path: pathlib.Path) -> bool:
    """Whether one module imports the wire format (`engine_hop.wire`), lazily or not."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import) and any(
            a.name == "engine_hop.wire" or a.name.startswith("engine_hop.wire.") for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module == "engine_hop.wire" or node.module.startswith("engine_hop.wire."):
                return True
            if node.module == "engine_hop" and any(a.name == "wire" for a in node.names):
                return True
    return False


def test_only_the_hop_reads_the_wire_format() -> None:
    """The wire format (engine_hop.wire: bodies, headers, streamed events, the link's
    frames) is read by the hop's own modules (its clients among them) and the engine
    server only: the gateway, admin and the rest talk to engines through an
    `EngineClient`."""
    readers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "platform").rglob("*.py")
        if _reads_the_wire(path)
    }
    assert readers, "the wire format has readers"
    outside = {
        r for r in readers if not r.startswith(("platform/engine_hop/", "platform/engine_server/"))
    }
    assert not outside, outside
    # The clients that moved into the hop read it, and nothing in the gateway does.
    assert "platform/engine_hop/remote_client.py" in readers
    assert "platform/engine_hop/link_client.py" in readers
    assert not any(r.startswith("platform/gateway/") for r in readers)


def _engine_module_imports(path: pathlib.Path) -> set[str]:
    """The `engine.*` modules one engine module imports, lazy imports included and
    `if TYPE_CHECKING:` blocks left out (those never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("engine."))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and not node.level
            and node.module.startswith("engine")
        ):
            # `from engine.x import y` may name a submodule y; count both.
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_engine_has_no_import_circles() -> None:
    """No engine module reaches itself through its imports. A protocol module that also
    held the factory for its implementations (which import the protocol) made a circle,
    bridged only by a lazy import; factories live in modules of their own."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (ROOT / "engine").rglob("*.py")
    }
    graph = {
        name: {m for m in _engine_module_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    # A package's __init__ re-exporting its modules is not a circle of the modules'
    # making: leave the edge from a module to its own parent package out.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, circles
