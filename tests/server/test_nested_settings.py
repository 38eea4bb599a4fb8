"""The settings nested by part (engine, gateway, telemetry, responses, admin): each
setting read from its nested variable and from the flat name it always had, both
names refused when they disagree, an unknown nested name refused, and the reference in
docs/settings.md written from the models themselves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from fastapi.testclient import TestClient

from assembly.app import build_app
from server.settings import Settings
from server.settings.flat_names import FLAT_NAMES, GROUPS, env_names
from server.settings.reference import reference_markdown
from tests.utils.built_app import close_app, fake_settings, migrated_sessions, tenant_keys
from tests.utils.fast_fake_model import gateway_test_engine

REPO = Path(__file__).resolve().parents[2]

# Every CLOISTER_* setting name before the settings were nested: each must still set
# something, so no deployment's environment stops working.
FLAT_NAMES_BEFORE = frozenset(
    [
        "environment",
        "data_dir",
        "database_url",
        "redis_url",
        "redis_key_prefix",
        "host",
        "port",
        "key_pepper",
        "limiter_fail_mode",
        "limiter_local_cap_rpm",
        "concurrency_mode",
        "concurrency_queue_timeout_s",
        "config_refresh_s",
        "auth_max_stale_s",
        "auth_read_timeout_s",
        "auth_failure_limit",
        "auth_failure_window_s",
        "forwarded_allow_ips",
        "audit_denial_window_s",
        "db_pool_size",
        "model",
        "model_name",
        "models",
        "device",
        "dtype",
        "weight_quant",
        "cpu_packed_linears",
        "attention_backend",
        "fused_ops",
        "prefix_cache",
        "scheduling_policy",
        "max_num_batched_tokens",
        "prefill_chunk_size",
        "itl_budget_ms",
        "kv_events_endpoint",
        "kv_events_topic",
        "kv_events_replay_endpoint",
        "kv_events_buffer_steps",
        "block_size",
        "gpu_memory_utilization",
        "retention_ttl_s",
        "scrub_freed_blocks",
        "strict_partition",
        "min_cached_blocks",
        "min_cached_share",
        "fair_cached_share",
        "kv_shares",
        "grammar_compile_timeout_s",
        "grammar_mask_budget_s",
        "enforce_eager",
        "engine_mode",
        "kv_cache_bytes",
        "kv_host_bytes",
        "kv_disk_path",
        "kv_disk_bytes",
        "speculative_method",
        "num_speculative_tokens",
        "speculative_model",
        "speculative_max_batch",
        "engine_urls",
        "router_policy",
        "engine_transport",
        "engine_read_timeout_s",
        "service_token",
        "max_num_seqs",
        "max_loras",
        "max_cpu_loras",
        "max_lora_rank",
        "lora_kernel",
        "lora_slot_quantum",
        "max_waiting",
        "max_model_len",
        "log_level",
        "log_format",
        "engine_log_interval_s",
        "metrics_top_tenants",
        "max_n",
        "responses_store",
        "responses_key_prefix",
        "responses_ttl_s",
        "responses_max_entries",
        "responses_max_per_tenant",
        "responses_max_chars",
        "responses_max_record_bytes",
        "responses_max_bytes_per_tenant",
        "batch_max_file_bytes",
        "batch_max_file_lines",
        "batch_max_files_per_tenant",
        "batch_max_bytes_per_tenant",
        "batch_max_queued_tokens",
        "batch_concurrency",
        "batch_lease_s",
        "files_s3_bucket",
        "files_s3_endpoint_url",
        "files_s3_region",
        "files_s3_prefix",
        "files_s3_access_key_id",
        "files_s3_secret_access_key",
        "files_s3_timeout_s",
        "tool_parser",
        "reasoning_parser",
        "otel_exporter",
        "otel_endpoint",
        "otel_protocol",
        "otel_service_name",
        "admin_oidc_issuer",
        "admin_oidc_client_id",
        "admin_oidc_client_secret",
        "admin_oidc_redirect_uri",
        "admin_oidc_scopes",
        "admin_oidc_role_claim",
        "admin_oidc_tenant_claim",
        "admin_oidc_default_role",
        "admin_session_ttl_s",
        "admin_session_key",
        "admin_audit_signing_key",
        "admin_audit_checkpoint_every",
        "admin_audit_checkpoint_interval_s",
        "admin_spool_path",
        "admin_usage_retention_days",
        "model_roots",
        "admin_adapter_upload_max_bytes",
    ]
)

# (flat variable, nested variable, a value other than the default, where code reads it)
ONE_PER_GROUP = [
    ("CLOISTER_BLOCK_SIZE", "CLOISTER_ENGINE__BLOCK_SIZE", "32", ("engine", "block_size")),
    (
        "CLOISTER_ROUTER_POLICY",
        "CLOISTER_GATEWAY__ROUTER_POLICY",
        "session",
        ("gateway", "router_policy"),
    ),
    ("CLOISTER_LOG_FORMAT", "CLOISTER_TELEMETRY__LOG_FORMAT", "json", ("telemetry", "log_format")),
    ("CLOISTER_RESPONSES_TTL_S", "CLOISTER_RESPONSES__TTL_S", "7.5", ("responses", "ttl_s")),
    (
        "CLOISTER_ADMIN_SESSION_TTL_S",
        "CLOISTER_ADMIN__SESSION_TTL_S",
        "600",
        ("admin", "session_ttl_s"),
    ),
]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[pytest.MonkeyPatch]:
    """A clean CLOISTER_* environment over a private data directory."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("CLOISTER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOISTER_DATA_DIR", str(tmp_path))
    yield monkeypatch


def _read(settings: Settings, place: tuple[str, str]) -> Any:
    group, field = place
    return getattr(getattr(settings, group), field)


# Settings added since, each with its flat name too.
ADDED_SINCE = frozenset(["overlap_scheduling", "overlap_min_forward_ms"])


def test_every_flat_name_from_before_the_nesting_is_still_a_setting() -> None:
    assert Settings.setting_names() == FLAT_NAMES_BEFORE | ADDED_SINCE


def test_the_groups_are_the_settings_nested_fields_and_no_flat_name_is_a_shared_one() -> None:
    shared = set(Settings.model_fields) - set(GROUPS)
    assert set(GROUPS) <= set(Settings.model_fields)
    assert not shared & set(FLAT_NAMES)


@pytest.mark.parametrize(("flat", "nested", "value", "place"), ONE_PER_GROUP)
def test_a_setting_is_read_from_its_nested_and_from_its_flat_variable(
    env: pytest.MonkeyPatch, flat: str, nested: str, value: str, place: tuple[str, str]
) -> None:
    default = _read(Settings(), place)
    env.setenv(nested, value)
    from_nested = _read(Settings(), place)
    env.delenv(nested)
    env.setenv(flat, value)
    from_flat = _read(Settings(), place)
    assert from_nested == from_flat != default


@pytest.mark.parametrize(("flat", "nested", "value", "place"), ONE_PER_GROUP)
def test_a_keyword_by_its_flat_name_outranks_the_environment(
    env: pytest.MonkeyPatch, flat: str, nested: str, value: str, place: tuple[str, str]
) -> None:
    env.setenv(nested, value)
    from_env = _read(Settings(), place)
    given = {"block_size": 64, "router_policy": "round_robin", "log_format": "console"}
    given |= {"responses_ttl_s": 9.0, "admin_session_ttl_s": 900}
    flat_name = flat.removeprefix("CLOISTER_").lower()
    settings = Settings(**{flat_name: given[flat_name]})
    assert _read(settings, place) == given[flat_name] != from_env


def test_both_names_with_different_values_are_refused_naming_both(
    env: pytest.MonkeyPatch,
) -> None:
    from cloister.commands.serve import load_settings

    env.setenv("CLOISTER_MAX_NUM_SEQS", "8")
    env.setenv("CLOISTER_ENGINE__MAX_NUM_SEQS", "16")
    with pytest.raises(click.ClickException) as refused:
        load_settings()
    message = refused.value.message
    assert "CLOISTER_MAX_NUM_SEQS" in message and "CLOISTER_ENGINE__MAX_NUM_SEQS" in message
    env.setenv("CLOISTER_ENGINE__MAX_NUM_SEQS", "8")  # the same value twice is one setting
    assert load_settings().engine.max_num_seqs == 8


def test_an_unknown_name_inside_a_group_is_refused(env: pytest.MonkeyPatch) -> None:
    from cloister.commands.serve import load_settings

    env.setenv("CLOISTER_ENGINE__BLOK_SIZE", "32")
    with pytest.raises(click.ClickException, match="engine.blok_size: Extra inputs"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        (
            "CLOISTER_ENGINE__BLOCK_SIZE",
            "0",
            "block_size: Input should be greater than or equal to 1 "
            "(CLOISTER_BLOCK_SIZE or CLOISTER_ENGINE__BLOCK_SIZE)",
        ),
        (
            "CLOISTER_RESPONSES_TTL_S",
            "-1",
            "responses_ttl_s: Input should be greater than 0 "
            "(CLOISTER_RESPONSES_TTL_S or CLOISTER_RESPONSES__TTL_S)",
        ),
        ("CLOISTER_PORT", "eighty", "port: Input should be a valid integer"),
        ("CLOISTER_ENGINE", "{not json", 'error parsing value for field "engine"'),
    ],
)
def test_a_bad_value_names_its_setting_and_variables(
    env: pytest.MonkeyPatch, variable: str, value: str, shown: str
) -> None:
    from cloister.commands.serve import load_settings

    env.setenv(variable, value)
    with pytest.raises(click.ClickException) as refused:
        load_settings()
    assert shown in refused.value.message


def test_names_and_variables_of_places() -> None:
    assert env_names(("engine", "block_size")) == (
        "block_size",
        ("CLOISTER_BLOCK_SIZE", "CLOISTER_ENGINE__BLOCK_SIZE"),
    )
    assert env_names(("admin", "oidc_issuer")) == (
        "admin_oidc_issuer",
        ("CLOISTER_ADMIN_OIDC_ISSUER", "CLOISTER_ADMIN__OIDC_ISSUER"),
    )
    assert env_names(("port",)) == ("port", ("CLOISTER_PORT",))
    assert env_names(("engine",)) == ("engine", ())  # a group's own check: no one variable
    assert env_names(("engine", "nothing")) == ("engine.nothing", ())


def test_the_settings_reference_is_current() -> None:
    written = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    assert written == reference_markdown(), "run python -m server.settings.reference"


def test_the_reference_lists_every_setting_with_both_names_and_a_note() -> None:
    text = reference_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(FLAT_NAMES_BEFORE | ADDED_SINCE)
    assert "`CLOISTER_BLOCK_SIZE`<br>`CLOISTER_ENGINE__BLOCK_SIZE`" in text
    assert "`CLOISTER_RESPONSES_TTL_S`<br>`CLOISTER_RESPONSES__TTL_S`" in text
    assert all(not row.rstrip().endswith("|  |") for row in rows), "a setting without a note"


@pytest.mark.parametrize("variable", ["CLOISTER_GATEWAY__TOOL_PARSER", "CLOISTER_TOOL_PARSER"])
def test_a_nested_variable_reaches_the_api(
    env: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    """Over HTTP: tool calling turned off by either name answers tools with a 400."""
    env.setenv(variable, "none")
    settings = fake_settings(tmp_path)
    assert settings.gateway.tool_parser == "none"
    keys = tenant_keys(migrated_sessions(settings), ("acme",))
    app = build_app(settings, engine=gateway_test_engine())
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    try:
        with TestClient(app) as client:
            answer = client.post(
                "/v1/chat/completions",
                json={
                    "model": "fake",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [tool],
                },
                headers={"Authorization": f"Bearer {keys['acme']}"},
            )
            plain = client.post(
                "/v1/chat/completions",
                json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {keys['acme']}"},
            )
    finally:
        close_app(app)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "tools"
    assert plain.status_code == 200, plain.text
