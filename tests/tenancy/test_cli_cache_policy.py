"""`cloister tenants update` (weight and cache policy) and `cloister prefixes ...`.

Changes are stored and audited as cli:<user>; bad input exits 2 with a clear message,
no traceback, and nothing stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest

from admin import registry
from cloister.commands.prefixes import commands as prefix_commands
from cloister.commands.tenants import commands as tenant_commands
from tenancy.db import make_engine, make_session_factory
from tests.tenancy.cli_db import audit, cli_db_url, cli_with_acme, run
from tests.utils.cache_policy_defaults import DEFAULT_CACHE_POLICY


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> click.Group:
    """The tenants and prefixes groups on a fresh SQLite database with tenant acme and
    model tiny registered."""
    root = cli_with_acme(
        tmp_path,
        monkeypatch,
        pepper="cli-policy-pepper",
        commands=[*tenant_commands, *prefix_commands],
    )
    engine = make_engine(cli_db_url(tmp_path))
    with make_session_factory(engine)() as s:
        registry.register_model(s, name="tiny", source="/m", format="gguf", context_length=64)
    engine.dispose()
    return root


def policy(cli: click.Group) -> dict[str, Any]:
    (tenant,) = json.loads(run(cli, "tenants", "list", "--json").output)
    keys = ("weight", "cache_floor_blocks", "cache_floor_share", "retention_ttl_s")
    return {k: tenant[k] for k in (*keys, "scrub_on_free", "never_cache", "kv_quota_blocks")}


DEFAULTS = DEFAULT_CACHE_POLICY


def test_update_sets_clears_and_audits(cli: click.Group, tmp_path: Path) -> None:
    res = run(
        cli,
        "tenants",
        "update",
        "acme",
        "--weight",
        "2",
        "--cache-floor-blocks",
        "12",
        "--retention-ttl-s",
        "30",
        "--scrub-on-free",
        "--never-cache",
        "--json",
    )
    assert res.exit_code == 0, res.output
    want = {
        **DEFAULTS,
        "weight": 2.0,
        "cache_floor_blocks": 12,
        "retention_ttl_s": 30.0,
        "scrub_on_free": True,
        "never_cache": True,
    }
    assert policy(cli) == want
    assert json.loads(res.output)["cache_floor_blocks"] == 12
    (event,) = audit(tmp_path, "tenant.update")
    assert event.actor.startswith("cli:") and event.detail is not None
    assert event.detail["cache_floor_blocks"] == 12 and event.detail["never_cache"] is True

    res = run(cli, "tenants", "update", "acme", "--cache-floor-share", "0.2", "--cache")
    assert res.exit_code == 0, res.output
    assert policy(cli) == {**want, "cache_floor_blocks": None, "cache_floor_share": 0.2,
                           "never_cache": False}  # fmt: skip
    res = run(
        cli,
        "tenants",
        "update",
        "acme",
        "--no-cache-floor",
        "--default-retention-ttl",
        "--default-scrub",
        "--weight",
        "1",
    )
    assert res.exit_code == 0, res.output
    assert policy(cli) == DEFAULTS
    assert len(audit(tmp_path, "tenant.update")) == 3


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--weight", "0"), ["weight"]),
        (("--weight", "inf"), ["weight"]),
        (("--weight", "nan"), ["weight"]),
        (("--weight", "heavy"), ["weight"]),
        (("--cache-floor-blocks", "-1"), ["cache floor blocks"]),
        (("--cache-floor-blocks", str(2**31)), ["cache floor blocks"]),
        (("--cache-floor-blocks", "1.5"), ["cache-floor-blocks"]),
        (("--cache-floor-share", "1.5"), ["cache floor share"]),
        (("--cache-floor-share", "-0.5"), ["cache floor share"]),
        (("--cache-floor-share", "nan"), ["cache floor share"]),
        (("--cache-floor-blocks", "3", "--cache-floor-share", "0.1"), ["cannot be combined"]),
        (("--cache-floor-blocks", "3", "--no-cache-floor"), ["cannot be combined"]),
        (("--retention-ttl-s", "0"), ["retention TTL"]),
        (("--retention-ttl-s", "-3"), ["retention TTL"]),
        (("--retention-ttl-s", "inf"), ["retention TTL"]),
        (("--retention-ttl-s", "1e12"), ["retention TTL"]),
        (("--retention-ttl-s", "3", "--default-retention-ttl"), ["cannot be combined"]),
        (("--scrub-on-free", "--default-scrub"), ["cannot be combined"]),
        (("--kv-quota-blocks", "0"), ["kv_quota_blocks", "1 to"]),
        (("--kv-quota-blocks", "-1"), ["kv_quota_blocks", "1 to"]),
        (("--kv-quota-blocks", str(2**31)), ["kv_quota_blocks"]),
        (("--kv-quota-blocks", "1.5"), ["kv-quota-blocks"]),
        (("--kv-quota-blocks", "lots"), ["kv-quota-blocks"]),
        (("--kv-quota-blocks", "3", "--no-kv-quota"), ["cannot be combined"]),
        ((), ["nothing to change"]),
    ],
)
def test_bad_update_is_refused(
    cli: click.Group, tmp_path: Path, args: tuple[str, ...], words: list[str]
) -> None:
    res = run(cli, "tenants", "update", "acme", *args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output
    for word in words:
        assert word in res.output, res.output
    assert policy(cli) == DEFAULTS
    assert audit(tmp_path, "tenant.update") == []


def test_kv_quota_is_set_shown_audited_and_cleared(cli: click.Group, tmp_path: Path) -> None:
    res = run(cli, "tenants", "update", "acme", "--kv-quota-blocks", "32", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kv_quota_blocks"] == 32
    assert policy(cli) == {**DEFAULTS, "kv_quota_blocks": 32}
    (event,) = audit(tmp_path, "tenant.update")
    assert event.detail is not None and event.detail["kv_quota_blocks"] == 32
    # Another policy change keeps it; --no-kv-quota and `none` clear it.
    assert run(cli, "tenants", "update", "acme", "--weight", "2").exit_code == 0
    assert policy(cli)["kv_quota_blocks"] == 32
    res = run(cli, "tenants", "update", "acme", "--no-kv-quota")
    assert res.exit_code == 0, res.output
    assert policy(cli) == {**DEFAULTS, "weight": 2.0}
    assert run(cli, "tenants", "update", "acme", "--kv-quota-blocks", "1").exit_code == 0
    assert policy(cli)["kv_quota_blocks"] == 1
    res = run(cli, "tenants", "update", "acme", "--kv-quota-blocks", "none")
    assert res.exit_code == 0, res.output
    assert policy(cli)["kv_quota_blocks"] is None


def test_update_of_unknown_tenant_is_a_clear_error(cli: click.Group) -> None:
    res = run(cli, "tenants", "update", "nobody", "--weight", "2")
    assert res.exit_code == 1 and "no tenant named 'nobody'" in res.output


def test_prefixes_publish_list_withdraw(cli: click.Group, tmp_path: Path) -> None:
    text_file = tmp_path / "system.txt"
    text_file.write_text("You are a helpful assistant.", encoding="utf-8")
    res = run(cli, "prefixes", "publish", "sys", "--model", "tiny", "--text-file", str(text_file))
    assert res.exit_code == 0, res.output
    res = run(cli, "prefixes", "publish", "ids", "--model", "tiny", "--token-ids", "1,2,3")
    assert res.exit_code == 0, res.output
    listed = json.loads(run(cli, "prefixes", "list", "--json").output)
    assert [(p["name"], p["text"], p["token_ids"]) for p in listed] == [
        ("ids", None, [1, 2, 3]),
        ("sys", "You are a helpful assistant.", None),
    ]
    assert "3 token ids" in run(cli, "prefixes", "list").output
    res = run(cli, "prefixes", "withdraw", "sys")
    assert res.exit_code == 0 and "withdrew prefix sys" in res.output
    assert [p["name"] for p in json.loads(run(cli, "prefixes", "list", "--json").output)] == ["ids"]
    assert [e.resource for e in audit(tmp_path, "prefix.publish")] == [
        "prefixes/sys",
        "prefixes/ids",
    ]
    (event,) = audit(tmp_path, "prefix.withdraw")
    assert event.actor.startswith("cli:") and event.resource == "prefixes/sys"
    res = run(cli, "prefixes", "withdraw", "sys")
    assert res.exit_code == 1 and "no shared prefix named 'sys'" in res.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--token-ids", "1,x"), ["token-ids"]),
        (("--token-ids", "-1"), ["token_ids"]),
        (("--token-ids", ""), ["token-ids"]),
        (("--text", ""), ["text must not be empty"]),
        (("--text", "a", "--token-ids", "1"), ["exactly one"]),
        ((), ["exactly one"]),
    ],
)
def test_bad_publish_is_refused(
    cli: click.Group, tmp_path: Path, args: tuple[str, ...], words: list[str]
) -> None:
    res = run(cli, "prefixes", "publish", "p", "--model", "tiny", *args)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output
    for word in words:
        assert word in res.output, res.output
    assert json.loads(run(cli, "prefixes", "list", "--json").output) == []
    assert audit(tmp_path, "prefix.publish") == []


def test_publish_for_an_unknown_model_is_a_clear_error(cli: click.Group) -> None:
    res = run(cli, "prefixes", "publish", "p", "--model", "nope", "--text", "hi")
    assert res.exit_code == 1 and "nope" in res.output and "Traceback" not in res.output
