"""The one Settings object: development defaults, production refusals, the admin slice."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from admin.settings import AdminSettings
from server.settings import Settings
from tests.utils.cli_refusals import assert_refused_by_name


def test_development_audit_key_is_made_once_and_private(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    first = AdminSettings.from_settings(settings).audit_signing_key
    second = AdminSettings.from_settings(Settings(data_dir=tmp_path)).audit_signing_key
    assert first is not None and second is not None
    assert first.get_secret_value() == second.get_secret_value()
    assert len(bytes.fromhex(first.get_secret_value())) == 32
    mode = stat.S_IMODE((tmp_path / "audit-signing.key").stat().st_mode)
    assert mode == 0o600


def test_explicit_admin_values_win(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        admin_audit_signing_key=SecretStr("ab" * 32),
        admin_spool_path=tmp_path / "s",
    )
    admin = AdminSettings.from_settings(settings)
    assert admin.audit_signing_key is not None
    assert admin.audit_signing_key.get_secret_value() == "ab" * 32
    assert admin.spool_path == tmp_path / "s"
    assert not (tmp_path / "audit-signing.key").exists()


def test_production_refuses_development_secrets() -> None:
    with pytest.raises(ValidationError, match="KEY_PEPPER"):
        Settings(environment="production")
    with pytest.raises(ValidationError, match="AUDIT_SIGNING_KEY"):
        Settings(
            environment="production",
            key_pepper=SecretStr("a-real-pepper"),
            admin_session_key=SecretStr("a-real-session-key"),
        )
    ok = Settings(
        environment="production",
        key_pepper=SecretStr("a-real-pepper"),
        admin_session_key=SecretStr("a-real-session-key"),
        admin_audit_signing_key=SecretStr("cd" * 32),
    )
    assert ok.environment == "production"


def test_model_roots_default_to_the_data_dir_and_the_served_model(tmp_path: Path) -> None:
    model = tmp_path / "elsewhere" / "m.gguf"
    roots = AdminSettings.from_settings(Settings(data_dir=tmp_path, model=str(model))).model_roots
    assert {tmp_path.resolve() / "models", tmp_path.resolve() / "adapters"} <= set(roots)
    assert model.resolve() in roots
    assert (tmp_path.resolve() / "cloister.db") not in roots


def test_model_roots_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOISTER_MODEL_ROOTS", f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}")
    roots = AdminSettings.from_settings(Settings(data_dir=tmp_path)).model_roots
    assert roots == ((tmp_path / "a").resolve(), (tmp_path / "b").resolve())


ENGINE_SETTINGS = {
    "device": "cpu",
    "dtype": "bfloat16",
    "attention_backend": "torch",
    "prefix_cache": "radix",
    "scheduling_policy": "fair",
    "max_num_seqs": 7,
    "max_num_batched_tokens": 333,
    "prefill_chunk_size": 64,
    "itl_budget_ms": 150.0,
    "max_waiting": 99,
    "max_n": 5,
    "max_model_len": 1000,
    "kv_cache_bytes": 12345678,
    "kv_host_bytes": 87654321,
    "kv_disk_path": "/var/cache/cloister-kv",
    "kv_disk_bytes": 1 << 30,
    "speculative_method": "ngram",
    "num_speculative_tokens": 6,
    "speculative_max_batch": 8,
    "gpu_memory_utilization": 0.5,
    "block_size": 32,
    "retention_ttl_s": 42.0,
    "scrub_freed_blocks": True,
    "strict_partition": True,
    "min_cached_blocks": 3,
    "min_cached_share": 0.25,
    "fair_cached_share": 0.05,
    "kv_shares": False,
    "grammar_compile_timeout_s": 2.5,
    "grammar_mask_budget_s": 0.75,
    "enforce_eager": True,
    "fused_ops": "off",
    "weight_quant": "int4",
    "cpu_packed_linears": True,
    "max_loras": 3,
    "max_cpu_loras": 5,
    "max_lora_rank": 32,
    "lora_kernel": "triton",
    "lora_slot_quantum": 9,
    "kv_events_endpoint": "tcp://indexer.kv.svc:5557",
    "kv_events_topic": "kv@pod-1@smol",
    "kv_events_replay_endpoint": "tcp://*:5558",
    "kv_events_buffer_steps": 500,
}


def engine_fields(config: object) -> dict[str, object]:
    """Every field of the engine config, flattened (model / cache / scheduler / top)."""
    import dataclasses

    out: dict[str, object] = {}
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update(engine_fields(value))
        else:
            out[f.name] = value
    return out


def test_kv_events_topics_default_to_llm_d_form_per_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from assembly import engines as engine_loading
    from assembly.engine_options import kv_events_topic, serve_engine_options

    topics: list[str] = []

    def fake_load(settings: Settings, *, model: str | None = None, **options: Any) -> str:
        topics.append(options["kv_events_topic"])
        return f"engine:{model}"

    monkeypatch.setattr(engine_loading, "load_engine", fake_load)
    two = Settings(data_dir=tmp_path, models=["a=/m/a", "b=/m/b"], kv_events_endpoint="tcp://i:1")
    engine_loading.load_engines(two)
    assert topics == [f"kv@{socket.gethostname()}@a", f"kv@{socket.gethostname()}@b"]

    settings = Settings(data_dir=tmp_path, model_name="smol", kv_events_endpoint="ipc:///tmp/kv")
    host = socket.gethostname()
    assert serve_engine_options(settings)["kv_events_topic"] == f"kv@{host}@smol"
    assert kv_events_topic(settings, "other") == f"kv@{host}@other"
    assert Settings(data_dir=tmp_path, kv_events_endpoint=" ").engine.kv_events_endpoint is None


def test_every_engine_setting_reaches_the_engine_config(tmp_path: Path) -> None:
    import torch

    from assembly.engine_options import serve_engine_options
    from engine.engine_builder import build_config

    default = engine_fields(build_config("m"))
    for name, value in ENGINE_SETTINGS.items():
        if name != "device":  # the default device is what this machine has
            assert default[name] != (getattr(torch, value) if name == "dtype" else value), name
    settings = Settings(data_dir=tmp_path, **ENGINE_SETTINGS)  # type: ignore[arg-type]
    config = engine_fields(build_config("m", **serve_engine_options(settings)))
    for name, value in ENGINE_SETTINGS.items():
        expected = getattr(torch, str(value)) if name == "dtype" else value
        assert config[name] == expected, name
    # The environment is the same path in.
    env = {f"CLOISTER_{k.upper()}": str(v) for k, v in ENGINE_SETTINGS.items()}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        from_env = Settings(data_dir=tmp_path)
    assert engine_fields(build_config("m", **serve_engine_options(from_env))) == config


def test_multi_tenant_defaults_and_auto_device() -> None:
    from assembly.engine_options import serve_engine_options

    settings = Settings()
    assert settings.engine.scheduling_policy == "fair_lpm"
    gpu = serve_engine_options(settings, cuda_available=True)
    assert (gpu["device"], gpu["dtype"], gpu["attention_backend"]) == ("cuda", "bfloat16", "auto")
    cpu = serve_engine_options(settings, cuda_available=False)
    assert (cpu["device"], cpu["dtype"]) == ("cpu", "float32")


@pytest.mark.parametrize(
    "bad",
    [
        {"max_loras": 0},
        {"max_loras": 4, "max_cpu_loras": 2},
        {"max_lora_rank": 0},
        {"lora_slot_quantum": 0},
        {"lora_kernel": "cuda"},
    ],
)
def test_bad_lora_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("FAIR_CACHED_SHARE", "-0.1"),
        ("FAIR_CACHED_SHARE", "1.5"),
        ("FAIR_CACHED_SHARE", "lots"),
        ("KV_SHARES", "maybe"),
        ("GRAMMAR_MASK_BUDGET_S", "0"),
        ("GRAMMAR_MASK_BUDGET_S", "-1"),
        ("GRAMMAR_MASK_BUDGET_S", "1e9"),
        ("GRAMMAR_MASK_BUDGET_S", "nan"),
        ("GRAMMAR_COMPILE_TIMEOUT_S", "0"),
        ("GRAMMAR_COMPILE_TIMEOUT_S", "forever"),
    ],
)
def test_bad_fairness_settings_are_refused_by_name(
    name: str, raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import click

    from cloister.commands.serve import load_settings

    monkeypatch.setenv(f"CLOISTER_{name}", raw)
    with pytest.raises(click.ClickException, match=name.lower()):
        load_settings()


def test_fair_defaults_protect_tenants() -> None:
    """Shares on and a flood floor by default: the protections hold with no setting."""
    settings = Settings()
    assert settings.engine.kv_shares is True
    assert settings.engine.fair_cached_share == 0.2


def test_weight_quant_is_refused_off_the_cpu() -> None:
    from assembly.engine_options import DeviceUnavailableError, serve_engine_options

    settings = Settings(weight_quant="int4")
    assert serve_engine_options(settings, cuda_available=False)["weight_quant"] == "int4"
    with pytest.raises(DeviceUnavailableError, match="CPU only"):
        serve_engine_options(settings, cuda_available=True)


def test_on_a_gpu_serve_picks_bf16_triton_fused_kernels_and_cuda_graphs() -> None:
    """The GPU path by default: what the engine makes of the options `cloister serve` passes."""
    import torch

    from assembly.engine_options import serve_engine_options
    from engine.attention.select import get_attention_backend
    from engine.engine_builder import build_config
    from engine.model.fused import resolve_fused_ops

    config = build_config("m", **serve_engine_options(Settings(), cuda_available=True))
    device = torch.device(config.model.device)
    assert device.type == "cuda" and config.model.dtype == torch.bfloat16
    assert get_attention_backend(config.attention_backend, device).name == "triton"
    assert resolve_fused_ops(config.model.fused_ops, device) is True
    assert config.model.enforce_eager is False  # decode steps replay captured CUDA graphs
    # On the CPU the same defaults are the torch reference path, fp32, unfused.
    cpu = build_config("m", **serve_engine_options(Settings(), cuda_available=False))
    assert cpu.model.dtype == torch.float32
    assert (
        get_attention_backend(cpu.attention_backend, torch.device("cpu")).name == "cpu"
    )  # the paged numba decode kernel
    assert resolve_fused_ops(cpu.model.fused_ops, torch.device("cpu")) is False


def test_fused_ops_on_needs_cuda() -> None:
    from assembly.engine_options import DeviceUnavailableError, serve_engine_options

    on = Settings(fused_ops="on")
    assert serve_engine_options(on, cuda_available=True)["fused_ops"] == "on"
    with pytest.raises(DeviceUnavailableError, match="fused_ops is 'on'"):
        serve_engine_options(on, cuda_available=False)
    assert (
        serve_engine_options(Settings(fused_ops="off"), cuda_available=True)["fused_ops"] == "off"
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--scheduling-policy", "bogus"],
        ["--block-size", "0"],
        ["--max-num-batched-tokens", "-1"],
        ["--itl-budget-ms", "0"],
        ["--itl-budget-ms", "-5"],
        ["--itl-budget-ms", "nan"],
        ["--itl-budget-ms", "inf"],
        ["--itl-budget-ms", "fast"],
        ["--prefill-chunk-size", "0"],
        ["--gpu-memory-utilization", "1.5"],
        ["--kv-host-bytes", "-1"],
        ["--dtype", "int8"],
        ["--fused-ops", "fast"],
        ["--fused-ops", "on", "--device", "cpu"],  # the kernels need CUDA
        ["--kv-events-endpoint", "http://indexer:5557"],
        ["--kv-events-endpoint", "tcp://indexer"],
        ["--kv-events-endpoint", "tcp://*:99999"],
        ["--kv-events-endpoint", "tcp://a b:5557"],
        # Two models, two engines: a binding endpoint would be bound twice.
        ["--kv-events-endpoint", "tcp://*:5557", "--model", "a=/m/a.gguf", "--model", "b=/m/b"],
    ],
)
def test_bad_engine_settings_are_refused_at_start(flags: list[str], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cloister.commands.serve import serve

    handlers = list(logging.getLogger().handlers)
    result = CliRunner().invoke(serve, ["--data-dir", str(tmp_path), *flags])
    # Refused before the log handler is installed: a handler left behind would outlive
    # the command (and its redaction filter would rewrite every later record).
    assert logging.getLogger().handlers == handlers
    assert_refused_by_name(result, flags)
    assert not (tmp_path / "cloister.db").exists()  # refused before anything started


def test_bad_environment_settings_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import click

    from assembly.engine_options import DeviceUnavailableError, resolve_device
    from cloister.commands.serve import load_settings

    monkeypatch.setenv("CLOISTER_PREFIX_CACHE", "trie")
    with pytest.raises(click.ClickException, match="prefix_cache"):
        load_settings()
    monkeypatch.delenv("CLOISTER_PREFIX_CACHE")
    monkeypatch.setenv("CLOISTER_CPU_PACKED_LINEARS", "maybe")
    with pytest.raises(click.ClickException, match="cpu_packed_linears"):
        load_settings()
    with pytest.raises(DeviceUnavailableError, match="no CUDA GPU"):
        resolve_device("cuda", cuda_available=False)


def test_cloister_serve_with_a_bad_environment_stops_with_the_name(tmp_path: Path) -> None:
    """The real process: CLOISTER_BLOCK_SIZE=0 ends `cloister serve` at once, no traceback."""
    import os
    import subprocess

    from tests.gateway.processes import SERVE_COMMAND
    from tests.utils.services import free_port

    env = {
        **os.environ,
        "CLOISTER_DATA_DIR": str(tmp_path),
        "CLOISTER_PORT": str(free_port()),
        "CLOISTER_BLOCK_SIZE": "0",
    }
    done = subprocess.run(SERVE_COMMAND, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "block_size" in done.stderr and "greater than or equal to 1" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_several_models_from_settings_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.settings import ModelSpec

    assert Settings(data_dir=tmp_path).served_models == (
        ModelSpec(name="smollm2-135m-instruct", path=None),  # the bundled default
    )
    one = Settings(data_dir=tmp_path, model="/m/one.gguf", model_name="one")
    assert one.served_models == (ModelSpec(name="one", path="/m/one.gguf"),)
    two = Settings(data_dir=tmp_path, models=["a=/m/a", "org/b=/m/b"])
    assert two.served_models == (ModelSpec("a", "/m/a"), ModelSpec("org/b", "/m/b"))
    assert {Path("/m/a").resolve(), Path("/m/b").resolve()} <= set(two.resolved_model_roots)
    monkeypatch.setenv("CLOISTER_MODELS", "a=/m/a, b=/m/b")  # comma-separated
    assert [s.name for s in Settings(data_dir=tmp_path).served_models] == ["a", "b"]
    monkeypatch.setenv("CLOISTER_MODELS", '["a=/m/a,1", "b=/m/b"]')  # JSON: commas in paths
    assert Settings(data_dir=tmp_path).served_models[0].path == "/m/a,1"


@pytest.mark.parametrize(
    ("models", "message"),
    [
        (["a=/m/a", "a=/m/b"], "given twice"),
        (["=/m/a"], "is not NAME=PATH"),
        (["a="], "is not NAME=PATH"),
        (["/m/a"], "is not NAME=PATH"),
        (["my model=/m/a"], "whitespace"),
    ],
)
def test_bad_model_entries_are_refused(models: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(data_dir=tmp_path, models=models)


def test_models_and_the_single_model_settings_do_not_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import click

    from cloister.commands.serve import load_settings

    with pytest.raises(ValidationError, match="not both"):
        Settings(data_dir=tmp_path, models=["a=/m/a"], model="/m/one")
    with pytest.raises(ValidationError, match="name each there"):
        Settings(data_dir=tmp_path, models=["a=/m/a"], model_name="one")
    monkeypatch.setenv("CLOISTER_MODELS", '["a=/m/a"')  # broken JSON: a clear error
    with pytest.raises(click.ClickException, match="models") as caught:
        load_settings(data_dir=tmp_path)
    assert "default factory" not in caught.value.message  # only the real error is shown


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[Any, Any]:
    """Invokes `cloister serve` with `flags`; returns the CLI result and the settings that
    reached `run_server` (None when it was refused before)."""
    from click.testing import CliRunner

    from cloister.commands import serve as serve_module

    reached: list[Settings] = []
    monkeypatch.setattr(serve_module, "run_server", reached.append)
    result = CliRunner().invoke(serve_module.serve, ["--data-dir", str(tmp_path), *flags])
    assert "Traceback" not in result.output
    return result, reached[0] if reached else None


def test_model_flag_is_repeatable_as_name_equals_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.settings import ModelSpec

    result, settings = _serve(tmp_path, monkeypatch, "--model", "a=/m/a", "--model", "b=/m/b")
    assert result.exit_code == 0, result.output
    assert settings.served_models == (ModelSpec("a", "/m/a"), ModelSpec("b", "/m/b"))
    assert settings.model is None
    result, settings = _serve(tmp_path, monkeypatch, "--model", "/m/one", "--model-name", "one")
    assert result.exit_code == 0, result.output
    assert settings.served_models == (ModelSpec("one", "/m/one"),)  # the old meaning
    # Flags replace the environment's choice, whichever form either uses.
    monkeypatch.setenv("CLOISTER_MODEL", "/m/env")
    _, settings = _serve(tmp_path, monkeypatch, "--model", "a=/m/a")
    assert settings.served_models == (ModelSpec("a", "/m/a"),)
    monkeypatch.delenv("CLOISTER_MODEL")
    monkeypatch.setenv("CLOISTER_MODELS", "x=/m/x,y=/m/y")
    _, settings = _serve(tmp_path, monkeypatch, "--model", "/m/one")
    assert [s.path for s in settings.served_models] == ["/m/one"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "/m/one", "--model", "b=/m/b"], "not both forms"),
        (["--model", "b=/m/b", "--model", "/m/one"], "not both forms"),
        (["--model", "/m/one", "--model", "/m/two"], "once"),
        (["--model", "a=/m/a", "--model", "a=/m/b"], "given twice"),
        (["--model", "a=", "--model", "b=/m/b"], "is not NAME=PATH"),
        (["--model", "a=/m/a", "--model-name", "n"], "name each there"),
    ],
)
def test_bad_model_flags_are_refused(
    flags: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, settings = _serve(tmp_path, monkeypatch, *flags)
    assert result.exit_code == 1 and settings is None, result.output
    assert message in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception


def test_models_share_the_gpu_memory_utilization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each engine sizes its pool after measuring the ones before it: engine i of n is let
    up to (i + 1) / n of the share, so each ends with about an equal part."""
    from assembly import engines as engine_loading

    calls: list[tuple[str | None, dict[str, Any]]] = []

    def fake_load(settings: Settings, *, model: str | None = None, **options: Any) -> str:
        calls.append((model, options))
        return f"engine:{model}"

    monkeypatch.setattr(engine_loading, "load_engine", fake_load)
    three = Settings(
        data_dir=tmp_path, models=["a=/m/a", "b=/m/b", "c=/m/c"], gpu_memory_utilization=0.9
    )
    assert engine_loading.load_engines(three, max_model_len=128) == {
        "a": "engine:/m/a",
        "b": "engine:/m/b",
        "c": "engine:/m/c",
    }
    shares = [options["gpu_memory_utilization"] for _, options in calls]
    assert shares == pytest.approx([0.3, 0.6, 0.9])
    assert all(options["max_model_len"] == 128 for _, options in calls)
    calls.clear()
    engine_loading.load_engines(Settings(data_dir=tmp_path, model="/m/one"))
    assert calls == [("/m/one", {})]  # one model: the setting as it is


def test_engine_urls_for_one_model_or_named_per_model() -> None:
    from server.settings import Settings, engine_url_groups

    one = Settings(engine_urls="http://a:1, dns+http://engines:8100")
    assert engine_url_groups(one.gateway.engine_urls, ("m",)) == {
        "m": ["http://a:1", "dns+http://engines:8100"]
    }
    named = Settings(engine_urls="small=dns+http://e-small:8100,big=http://b:1,big=http://c:1")
    groups = engine_url_groups(named.gateway.engine_urls, ("small", "big"))
    assert groups == {"small": ["dns+http://e-small:8100"], "big": ["http://b:1", "http://c:1"]}
    for bad, message in (
        ("ftp://x", "an engine URL is"),
        ("small=ftp://x", "an engine URL is"),
    ):
        with pytest.raises(ValueError, match=message):
            Settings(engine_urls=bad)
    with pytest.raises(ValueError, match="several models, give each engine URL as NAME=URL"):
        engine_url_groups(("http://a:1",), ("small", "big"))
    with pytest.raises(ValueError, match="every engine URL as NAME=URL, or none"):
        engine_url_groups(("small=http://a:1", "http://b:1"), ("small",))
    with pytest.raises(ValueError, match="the served models are"):
        engine_url_groups(("other=http://a:1",), ("small",))


@pytest.mark.parametrize("off", ["off", "OFF", "none", ""])
def test_the_itl_budget_can_be_turned_off(off: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().engine.itl_budget_ms == 200.0  # serve's default
    assert Settings(itl_budget_ms=off).engine.itl_budget_ms is None  # type: ignore[arg-type]
    monkeypatch.setenv("CLOISTER_ITL_BUDGET_MS", off)
    assert Settings().engine.itl_budget_ms is None
    monkeypatch.setenv("CLOISTER_ITL_BUDGET_MS", "120")
    assert Settings().engine.itl_budget_ms == 120.0


@pytest.mark.parametrize(
    ("raw", "options"),
    [
        (None, {"proxy_headers": True, "forwarded_allow_ips": ["127.0.0.1", "::1"]}),
        ("", {"proxy_headers": False, "forwarded_allow_ips": []}),
        ("*", {"proxy_headers": True, "forwarded_allow_ips": ["*"]}),
        (
            " 10.0.0.0/8, fd00::/8 ,10.1.2.3",
            {"proxy_headers": True, "forwarded_allow_ips": ["10.0.0.0/8", "fd00::/8", "10.1.2.3"]},
        ),
    ],
)
def test_trusted_proxies_become_uvicorns_options(
    raw: str | None, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from cloister.commands.serve import load_settings

    if raw is not None:
        monkeypatch.setenv("CLOISTER_FORWARDED_ALLOW_IPS", raw)
    assert load_settings().proxy_header_options() == options


@pytest.mark.parametrize(
    "raw",
    [
        "ingress.local",  # uvicorn would take a name as a literal that never matches
        "10.0.0.1/8",  # host bits set: a typo for an address or a network
        "10.0.0.0/33",
        "*,10.0.0.0/8",
        "127.0.0.1;10.0.0.1",
    ],
)
def test_bad_trusted_proxies_are_refused_by_name(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import click

    from cloister.commands.serve import load_settings

    monkeypatch.setenv("CLOISTER_FORWARDED_ALLOW_IPS", raw)
    with pytest.raises(click.ClickException, match="forwarded_allow_ips") as info:
        load_settings()
    assert "Traceback" not in info.value.message


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kv_events_replay_endpoint": "tcp://*:5558"}, "set both"),
        (
            {"kv_events_endpoint": "tcp://*:5557", "kv_events_replay_endpoint": "tcp://*:5557"},
            "must differ",
        ),
        (  # the replay socket binds: a remote host is no place for it
            {"kv_events_endpoint": "tcp://i:1", "kv_events_replay_endpoint": "tcp://indexer:5558"},
            "tcp://\\*:PORT or ipc://path",
        ),
        ({"kv_events_endpoint": "tcp://i:1", "kv_events_replay_endpoint": "http://x:1"}, "must be"),
        (
            {
                "kv_events_endpoint": "tcp://i:1",
                "kv_events_replay_endpoint": "tcp://*:5558",
                "models": ["a=/m/a", "b=/m/b"],
            },
            "2 served models",
        ),
        ({"kv_events_endpoint": "tcp://i:1", "kv_events_buffer_steps": 0}, "greater than"),
    ],
)
def test_bad_kv_events_replay_settings_are_refused(
    settings: dict[str, Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(data_dir=tmp_path, **settings)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CLOISTER_KV_DISK_BYTES": "-1"}, "kv_disk_bytes"),
        ({"CLOISTER_KV_DISK_BYTES": "lots"}, "kv_disk_bytes"),
    ],
)
def test_bad_disk_tier_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=message):
        Settings()


def test_disk_tier_settings_reach_the_engine_and_an_empty_path_is_off(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from assembly.engine_options import serve_engine_options

    monkeypatch.setenv("CLOISTER_KV_DISK_PATH", "")
    assert Settings().engine.kv_disk_path is None
    monkeypatch.setenv("CLOISTER_KV_DISK_PATH", str(tmp_path / "kv"))
    monkeypatch.setenv("CLOISTER_KV_DISK_BYTES", str(1 << 28))
    options = serve_engine_options(Settings())
    assert options["kv_disk_path"] == str(tmp_path / "kv")
    assert options["kv_disk_bytes"] == 1 << 28
