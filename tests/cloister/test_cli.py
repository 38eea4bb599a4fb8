"""The `cloister` command line as a user meets it: where the data is, one-line errors,
`--version`, deleting tenants, clearing limits and key aliases/metadata."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from sqlalchemy import func, select

from cloister.cli import main
from tenancy.authenticator import Authenticator
from tenancy.db import make_engine, make_session_factory
from tenancy.errors import AuthenticationError
from tenancy.models import ApiKey, Tenant

REPO = Path(__file__).resolve().parents[2]
# Location variables of the outer environment must not leak into these invocations.
NO_LOCATION = {"CLOISTER_DATA_DIR": None, "CLOISTER_DATABASE_URL": None}


def cli(*args: str) -> Result:
    """`cloister ARGS` in-process, with no location from the environment."""
    return CliRunner().invoke(main, list(args), env=NO_LOCATION)


def ok_json(*args: str) -> Any:
    """`cloister ARGS --json`, which must succeed; its one JSON document."""
    res = cli(*args, "--json")
    assert res.exit_code == 0, (res.output, res.exception)
    return json.loads(res.stdout)


def assert_one_line_error(res: Result, *words: str, code: int | None = None) -> None:
    """A refusal: non-zero exit, nothing on stdout, exactly one `error: ...` line on stderr."""
    assert res.exit_code != 0 and (code is None or res.exit_code == code), (
        res.exit_code,
        res.output,
    )
    assert isinstance(res.exception, SystemExit), res.exception
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for word in words:
        assert word in lines[0], lines[0]


def data_with_acme(folder: Path) -> str:
    """`folder` as a data folder holding tenant `acme`."""
    assert cli("tenants", "create", "acme", "--data-dir", str(folder)).exit_code == 0
    return str(folder)


@pytest.fixture
def data(tmp_path: Path) -> str:
    """A fresh data folder holding tenant `acme`."""
    return data_with_acme(tmp_path / "data")


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One data folder with `acme` for the refusals (each checks that nothing was made)."""
    return data_with_acme(tmp_path_factory.mktemp("refusals") / "data")


def engine_of(folder: str) -> sa.Engine:
    """An engine on the SQLite database of data folder `folder`."""
    return make_engine(f"sqlite:///{Path(folder).resolve() / 'cloister.db'}")


def test_version_is_the_package_version() -> None:
    res = cli("--version")
    assert res.exit_code == 0
    assert res.stdout.strip() == f"cloister, version {importlib.metadata.version('cloister')}"


def test_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real process, run from a folder without a database: one line and nothing made
    there; with --data-dir the same command works from there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data_dir = tmp_path / "srv" / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOISTER_")}
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{REPO / 'platform'}"
    lost = subprocess.run(
        [sys.executable, "-c", "from cloister.cli import main; main()", "tenants", "list"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lost.returncode == 1 and lost.stdout == ""
    assert lost.stderr.count("\n") == 1 and lost.stderr.startswith("error: no database at ")
    assert "--data-dir" in lost.stderr and "Traceback" not in lost.stderr
    assert list(elsewhere.iterdir()) == []  # no ./var, no secrets, no empty database
    monkeypatch.chdir(elsewhere)  # the same folder, in-process from here on
    assert cli("tenants", "create", "acme", "--data-dir", str(data_dir)).exit_code == 0
    listed = ok_json("tenants", "list", "--data-dir", str(data_dir))
    assert isinstance(listed, list) and [t["name"] for t in listed] == ["acme"]
    assert (data_dir / "cloister.db").is_file() and list(elsewhere.iterdir()) == []
    assert_one_line_error(cli("tenants", "list"), "no database at")  # in-process too


def test_database_url_flag_and_its_errors(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    made = cli("tenants", "create", "beta", "--database-url", url, "--data-dir", str(tmp_path))
    assert made.exit_code == 0, made.output
    listed = ok_json("tenants", "list", "--database-url", url, "--data-dir", str(tmp_path))
    assert [t["name"] for t in listed] == ["beta"]
    down = cli("tenants", "list", "--database-url", "postgresql://u:hunter2@127.0.0.1:1/x")
    assert_one_line_error(down, "cannot reach the database", "u:***@127.0.0.1", code=1)
    assert "hunter2" not in down.output
    assert_one_line_error(cli("tenants", "list", "--database-url", "bogus"), "not a database URL")
    missing_dir = f"sqlite:///{tmp_path / 'no' / 'such' / 'x.db'}"
    assert_one_line_error(cli("tenants", "list", "--database-url", missing_dir), "database")


LONG = "v" * 257


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["tenants", "set-limits", "acme", "--rpm", "abc"], ["--rpm"]),
        (["tenants", "set-limits", "acme", "--rpm", "-1"], ["--rpm"]),
        (["tenants", "set-limits", "acme", "--budget-period", "day"], ["--budget"]),
        (["tenants", "create", "bad/name"], ["tenant name"]),
        (["tenants", "create", "x" * 64], ["tenant name"]),
        (["tenants", "create", "acme"], ["already exists"]),
        (["tenants", "delete", "ghost", "--yes"], ["no tenant named 'ghost'"]),
        (["tenants", "suspend", "ghost"], ["ghost"]),
        (["tenants", "update", "acme", "--weight", "0"], ["weight"]),
        (["keys", "create", "--tenant", "acme", "--name", "two\nlines"], ["key name"]),
        (["keys", "create", "--tenant", "acme", "--name", "   "], ["key name"]),
        (["keys", "create", "--tenant", "acme", "--name", "k" * 129], ["key name"]),
        (["keys", "create", "--tenant", "acme", "--metadata", "novalue"], ["KEY=VALUE"]),
        (
            ["keys", "create", "--tenant", "acme", "--metadata", "a=1", "--metadata", "a=2"],
            ["twice"],
        ),
        (["keys", "create", "--tenant", "acme", "--metadata", "-x=1"], ["metadata keys"]),
        (["keys", "create", "--tenant", "acme", "--metadata", "api_key=1"], ["secret"]),
        (["keys", "create", "--tenant", "acme", "--metadata", f"note={LONG}"], ["at most 256"]),
        (["keys", "create", "--tenant", "acme", "--metadata", "n=sk-clo-abc"], ["credential"]),
        (
            ["keys", "create", "--tenant", "acme", *[f"--metadata=k{i}=v" for i in range(17)]],
            ["at most 16"],
        ),
        (["keys", "create", "--tenant", "ghost"], ["ghost"]),
        (["keys", "revoke", "key_nope"], ["key_nope"]),
        (["keys", "list"], ["--tenant"]),
        (["billing", "export", "--period", "nope"], ["--period"]),
        (["admin", "create-token", "--role", "tenant-admin"], ["tenant"]),
        (["prefixes", "withdraw", "nope"], ["nope"]),
        (["tenants", "frobnicate"], ["frobnicate"]),
    ],
)
def test_bad_input_is_one_line(shared_data: str, args: list[str], words: list[str]) -> None:
    assert_one_line_error(cli(*args, "--data-dir", shared_data), *words)
    tenants = ok_json("tenants", "list", "--all", "--data-dir", shared_data)
    assert isinstance(tenants, list) and [t["status"] for t in tenants] == ["active"]
    assert ok_json("keys", "list", "--tenant", "acme", "--data-dir", shared_data) == []


def test_delete_revokes_keys_keeps_usage_and_is_audited(data: str) -> None:
    from admin.models import AuditEvent, UsageRow

    key = ok_json("keys", "create", "--tenant", "acme", "--data-dir", data)
    assert isinstance(key, dict)
    pepper = (Path(data) / "key-pepper").read_text().strip()
    engine = engine_of(data)
    sessions = make_session_factory(engine)
    clock = [0.0]
    auth = Authenticator(sessions, pepper, refresh_s=1.0, clock=lambda: clock[0])
    principal = auth.authenticate(key["key"])
    with sessions() as s:
        s.add(
            UsageRow(
                request_id="req-1",
                occurred_at=dt.datetime.now(dt.UTC),
                tenant_id=principal.tenant_id,
                key_id=key["id"],
                model="m",
                prompt_tokens=5,
                cached_tokens=0,
                completion_tokens=3,
                cost_pico_usd=0,
                latency_s=0.1,
                status=200,
            )
        )
        s.commit()
    refused = cli("tenants", "delete", "acme", "--data-dir", data)  # no tty, no --yes
    assert_one_line_error(refused, "--yes", code=2)
    deleted = ok_json("tenants", "delete", "acme", "--yes", "--data-dir", data)
    assert isinstance(deleted, dict)
    assert deleted["status"] == "deleted" and deleted["revoked_key_ids"] == [key["id"]]
    clock[0] += 5.0  # past the refresh interval: what a running gateway sees
    with pytest.raises(AuthenticationError) as denied:
        auth.authenticate(key["key"])
    assert denied.value.reason == "revoked"
    assert ok_json("tenants", "list", "--data-dir", data) == []
    everyone = ok_json("tenants", "list", "--all", "--data-dir", data)
    assert [t["status"] for t in everyone] == ["deleted"]
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(UsageRow)) == 1
        tenant = s.scalars(select(Tenant)).one()
        assert tenant.deleted_at is not None and tenant.status == "suspended"
        actions = s.scalars(select(AuditEvent.action).order_by(AuditEvent.seq)).all()
        assert actions[-1] == "tenant.delete"
    # Deleted stays deleted: no resume, no new key, no second delete, the name stays taken.
    for args in (
        ["tenants", "resume", "acme"],
        ["keys", "create", "--tenant", "acme"],
        ["tenants", "delete", "acme", "--yes"],
        ["tenants", "create", "acme"],
    ):
        assert_one_line_error(cli(*args, "--data-dir", data), "acme")
    engine.dispose()


def test_every_limit_option_clears_with_none(data: str) -> None:
    set_all = [
        *("--rpm", "5", "--tpm", "100", "--concurrency", "2", "--budget", "1000"),
        *("--budget-period", "day", "--max-output-tokens", "64", "--max-prompt-tokens", "512"),
        *("--models", "a,b"),
    ]
    limits = ok_json("tenants", "set-limits", "acme", *set_all, "--data-dir", data)
    assert (
        isinstance(limits, dict) and limits["rpm"] == 5 and limits["allowed_models"] == ["a", "b"]
    )
    only_rpm = ok_json("tenants", "set-limits", "acme", "--rpm", "none", "--data-dir", data)
    assert isinstance(only_rpm, dict) and only_rpm["rpm"] is None and only_rpm["tpm"] == 100
    clear_rest = [
        *("--tpm", "None", "--concurrency", "none", "--budget", "none"),
        *("--budget-period", "none", "--max-output-tokens", "none"),
        *("--max-prompt-tokens", "NONE", "--models", "none"),
        *("--max-tokens-in-flight", "none"),
    ]
    cleared = ok_json("tenants", "set-limits", "acme", *clear_rest, "--data-dir", data)
    assert isinstance(cleared, dict)
    for field in (
        "rpm",
        "tpm",
        "max_concurrent",
        "token_budget",
        "max_output_tokens",
        "max_tokens_in_flight",
    ):
        assert cleared[field] is None, field
    assert cleared["max_prompt_tokens"] is None and cleared["allowed_models"] is None


def test_key_alias_and_metadata_are_stored_and_listed_without_secrets(data: str) -> None:
    meta = ["--metadata", "team=search", "--metadata", "env=prod eu"]
    created = ok_json(
        "keys", "create", "--tenant", "acme", "--name", "ci bot", *meta, "--data-dir", data
    )
    assert isinstance(created, dict) and set(created) == {"id", "key"}
    listed = ok_json("keys", "list", "--tenant", "acme", "--data-dir", data)
    assert isinstance(listed, list)
    assert listed[0]["name"] == "ci bot"
    assert listed[0]["metadata"] == {"env": "prod eu", "team": "search"}
    text = cli("keys", "list", "--tenant", "acme", "--data-dir", data)
    assert "ci bot" in text.stdout and "env=prod eu,team=search" in text.stdout
    engine = engine_of(data)
    with make_session_factory(engine)() as s:
        row = s.scalars(select(ApiKey)).one()
        assert row.key_metadata == {"env": "prod eu", "team": "search"}
        secret_hash = row.secret_hash
    engine.dispose()
    for output in (text.stdout, json.dumps(listed)):
        assert created["key"] not in output and secret_hash not in output


def test_update_clears_floor_and_ttl_with_none(data: str) -> None:
    set_policy = ["--cache-floor-blocks", "64", "--retention-ttl-s", "600", "--data-dir", data]
    tenant = ok_json("tenants", "update", "acme", *set_policy)
    assert isinstance(tenant, dict)
    assert (tenant["cache_floor_blocks"], tenant["retention_ttl_s"]) == (64, 600.0)
    clear = ["--cache-floor-blocks", "none", "--retention-ttl-s", "none", "--data-dir", data]
    tenant = ok_json("tenants", "update", "acme", *clear)
    assert isinstance(tenant, dict)
    assert (tenant["cache_floor_blocks"], tenant["retention_ttl_s"]) == (None, None)


def test_update_sets_and_clears_kv_quota(data: str) -> None:
    tenant = ok_json("tenants", "update", "acme", "--kv-quota-blocks", "16", "--data-dir", data)
    assert isinstance(tenant, dict) and tenant["kv_quota_blocks"] == 16
    (listed,) = ok_json("tenants", "list", "--data-dir", data)
    assert listed["kv_quota_blocks"] == 16
    tenant = ok_json("tenants", "update", "acme", "--no-kv-quota", "--data-dir", data)
    assert isinstance(tenant, dict) and tenant["kv_quota_blocks"] is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0", ("kv_quota_blocks", "from 1 to")),
        ("-1", ("kv_quota_blocks", "from 1 to")),
        (str(2**31), ("kv_quota_blocks",)),
        ("1.5", ("--kv-quota-blocks",)),
    ],
)
def test_bad_kv_quota_is_one_line(shared_data: str, value: str, words: tuple[str, ...]) -> None:
    res = cli("tenants", "update", "acme", "--kv-quota-blocks", value, "--data-dir", shared_data)
    assert_one_line_error(res, *words, code=2)
    (listed,) = ok_json("tenants", "list", "--data-dir", shared_data)
    assert listed["kv_quota_blocks"] is None


def test_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert_one_line_error(cli("tenants", "list", "--data-dir", str(a_file)), "--data-dir")
    assert_one_line_error(cli("tenants", "list", "--data-dir", str(a_file / "below")))


def test_a_bug_is_one_line_unless_traceback_is_asked_for(
    data: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenancy import store

    def broken(*_args: object, **_kw: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(store, "list_tenants", broken)
    assert_one_line_error(cli("tenants", "list", "--data-dir", data), "RuntimeError: boom")
    shown = cli("--traceback", "tenants", "list", "--data-dir", data)
    assert isinstance(shown.exception, RuntimeError)  # raised to the caller, traceback and all


def test_first_start_hint_names_the_data_folder(tmp_path: Path) -> None:
    from cloister.commands.serve import location_flags
    from server.settings import Settings

    default = Settings(data_dir=Path("./var"), key_pepper="p", admin_session_key="s")
    assert location_flags(default) == ""  # (both secrets given: nothing made in ./var)
    custom = Settings(data_dir=tmp_path, database_url="postgresql://u:pw@db/x")
    flags = location_flags(custom)
    assert f"--data-dir {tmp_path.resolve()}" in flags and "u:***@db/x" in flags
    assert "pw" not in flags


def _names(res: Result, field: str) -> None:
    """A one-line refusal (exit 2) naming `field`, as option or as field name."""
    assert_one_line_error(res, code=2)
    assert field in res.stderr.replace("-", "_"), res.stderr


def test_tokens_in_flight_limit_is_set_and_cleared(data: str) -> None:
    limits = ok_json(
        "tenants", "set-limits", "acme", "--max-tokens-in-flight", "4096", "--data-dir", data
    )
    assert isinstance(limits, dict) and limits["max_tokens_in_flight"] == 4096
    assert (
        "max_tokens_in_flight: 4096"
        in cli("tenants", "set-limits", "acme", "--rpm", "5", "--data-dir", data).stdout
    )


@pytest.mark.parametrize("value", ["0", "-1", "x", "true", str(2**31)])
def test_bad_tokens_in_flight_is_one_line(shared_data: str, value: str) -> None:
    res = cli(
        "tenants", "set-limits", "acme", "--max-tokens-in-flight", value, "--data-dir", shared_data
    )
    _names(res, "max_tokens_in_flight")


def _with_model(folder: str) -> None:
    from admin import registry

    engine = engine_of(folder)
    with make_session_factory(engine)() as s:
        registry.register_model(s, name="tiny", source="/m", format="gguf", context_length=512)
    engine.dispose()


def test_models_set_and_clear_the_output_cap(data: str) -> None:
    _with_model(data)
    (listed,) = ok_json("models", "list", "--data-dir", data)
    assert listed["name"] == "tiny" and listed["max_output_tokens"] is None
    model = ok_json("models", "set", "tiny", "--max-output-tokens", "64", "--data-dir", data)
    assert isinstance(model, dict) and model["max_output_tokens"] == 64
    assert "64" in cli("models", "list", "--data-dir", data).stdout
    model = ok_json("models", "set", "tiny", "--max-output-tokens", "none", "--data-dir", data)
    assert isinstance(model, dict) and model["max_output_tokens"] is None
    res = cli("models", "set", "ghost", "--max-output-tokens", "8", "--data-dir", data)
    assert_one_line_error(res, "ghost", code=1)


@pytest.mark.parametrize("value", ["0", "-1", str(10**9), "x", "true", "513", "1.5"])
def test_bad_model_output_cap_is_one_line(data: str, value: str) -> None:
    _with_model(data)
    res = cli("models", "set", "tiny", "--max-output-tokens", value, "--data-dir", data)
    _names(res, "max_output_tokens")
    (listed,) = ok_json("models", "list", "--data-dir", data)
    assert listed["max_output_tokens"] is None
