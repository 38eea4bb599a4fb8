"""`--json` on every `cloister` command: one JSON document on stdout, nothing else there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from cloister.cli import main

NO_LOCATION = {"CLOISTER_DATA_DIR": None, "CLOISTER_DATABASE_URL": None}
# Long-running servers and the benchmarks (which have --json-out) print no result.
NO_JSON = {"serve", "admin serve", "engine serve", "bench kernels", "bench serve"}
# Planning tools: JSON of their own, checked in tests/planning (they read no database).
PLANNING = {"capacity", "reuse-replay"}
# Read no database; their JSON is checked in their own tests (test_cli_families.py and
# test_generate_json below).
NO_DATABASE = {"generate", "models families"}
# Commands that touch no data folder or database.
NO_STORAGE = NO_JSON | PLANNING | NO_DATABASE


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), env=NO_LOCATION)


def leaf_commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every runnable command of `group`, by its path ("tenants list")."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(leaf_commands(command, f"{path} "))
        else:
            found[path] = command
    return found


def option_names(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in getattr(p, "opts", [])}


# Each command with the arguments it needs; {placeholders} come from the `state` fixture.
JSON_COMMANDS: dict[str, list[str]] = {
    "tenants create": ["new-tenant"],
    "tenants list": ["--all"],
    "tenants set-limits": ["acme", "--rpm", "3", "--tpm", "none"],
    "tenants update": ["acme", "--weight", "2"],
    "tenants suspend": ["paused"],
    "tenants resume": ["acme"],
    "tenants delete": ["doomed", "--yes"],
    "keys create": ["--tenant", "acme", "--name", "k", "--metadata", "env=ci"],
    "keys list": ["--tenant", "acme"],
    "keys revoke": ["{key_id}"],
    "prefixes publish": ["p1", "--model", "m", "--token-ids", "1,2,3"],
    "prefixes list": [],
    "prefixes withdraw": ["old"],
    "batches list": ["acme"],
    "models list": [],
    "models set": ["m", "--max-output-tokens", "32"],
    "admin create-token": ["--role", "viewer"],
    "admin revoke-token": ["{token_id}"],
    "billing export": ["--period", "2026-11"],
    "audit verify": [],
    "audit export": [],
    "db upgrade": [],
    "db wait": ["--timeout-s", "5"],
    "db secrets": [],
}


def test_every_command_is_covered() -> None:
    """The table above is the whole CLI (a new command must say how it prints JSON)."""
    commands = leaf_commands(main)
    assert set(JSON_COMMANDS) == set(commands) - NO_JSON - PLANNING - NO_DATABASE
    for path, command in commands.items():
        names = option_names(command)
        assert ("--json" in names) == (path not in NO_JSON), path
        storage = {"--data-dir", "--database-url"} <= names
        assert storage or path in NO_STORAGE - {"serve"}, path
    assert "--database-url" in option_names(commands["serve"])


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A data folder with tenants acme, paused and doomed, a key, an admin token, a model
    and a published prefix `old`; the placeholders the table uses."""
    from admin import registry
    from tenancy.db import make_engine, make_session_factory

    data = tmp_path_factory.mktemp("json") / "data"
    where = ["--data-dir", str(data)]
    for name in ("acme", "paused", "doomed"):
        assert cli("tenants", "create", name, *where).exit_code == 0
    key = json.loads(cli("keys", "create", "--tenant", "acme", "--json", *where).stdout)
    token = json.loads(cli("admin", "create-token", "--role", "admin", "--json", *where).stdout)
    engine = make_engine(f"sqlite:///{data.resolve() / 'cloister.db'}")
    with make_session_factory(engine)() as session:
        registry.register_model(
            session, name="m", source=str(data), format="gguf", context_length=64
        )
    engine.dispose()
    assert (
        cli("prefixes", "publish", "old", "--model", "m", "--token-ids", "7", *where).exit_code == 0
    )
    return {"data": str(data), "key_id": key["id"], "token_id": token["id"]}


@pytest.mark.parametrize("path", list(JSON_COMMANDS))
def test_json_output_is_one_document(state: dict[str, str], path: str) -> None:
    args = [a.format(**state) for a in JSON_COMMANDS[path]]
    res = cli(*path.split(), *args, "--json", "--data-dir", state["data"])
    assert res.exit_code == 0, (res.output, res.exception)
    document: Any = json.loads(res.stdout)  # the whole of stdout: one document
    assert isinstance(document, dict | list)
    for secret_field in ("secret_hash", "key_pepper"):
        assert secret_field not in res.stdout
    if path == "admin create-token":
        assert document["id"].startswith("adm_") and document["token"].startswith("clo-adm-")
    if path == "tenants delete":
        assert document["status"] == "deleted"
    if path == "audit verify":
        assert document["ok"] is True and document["records"] >= 5


@pytest.mark.slow  # torch and a model load: 3 s alone, 20 s on a busy machine
def test_generate_json(tmp_path: Path) -> None:
    from tests.utils.tiny_model import make_tiny_model_dir

    model = make_tiny_model_dir(tmp_path / "tiny")
    res = cli("generate", "hello", "--model", str(model), "--max-tokens", "3", "--raw", "--json")
    assert res.exit_code == 0, (res.output, res.exception)
    document = json.loads(res.stdout)
    assert set(document) == {"text", "finish_reason", "prompt_tokens", "completion_tokens"}
    assert document["completion_tokens"] <= 3 and document["prompt_tokens"] >= 1
