"""`cloister serve`: flags to settings, then uvicorn over the app `assembly.app` builds."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from cloister.cli_db import redact_url
from cloister.commands.engine_flags import engine_options
from server.settings import Settings

FIRST_START_HINT = """\
No tenants yet. Create one and a key for it:

    cloister tenants create acme{where}
    cloister keys create --tenant acme{where}

then call the API:

    curl http://{host}:{port}/v1/chat/completions \\
      -H "Authorization: Bearer <the key>" -H "Content-Type: application/json" \\
      -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello"}}]}}'
"""


@click.command()
@click.option("--host", default=None, help="Interface to bind (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port to bind (default 8000).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data folder.")
@click.option(
    "--database-url", default=None, metavar="URL", help="Database (default: SQLite in it)."
)
@click.option(
    "--model",
    "model_flags",
    multiple=True,
    help="GGUF file or HF folder (default: bundled SmolLM2); or NAME=PATH, repeatable, "
    "to serve several base models, each on its own engine.",
)
@click.option("--model-name", default=None, help="The name clients use in `model` (one model).")
@click.option("--redis-url", default=None, help="Share limiter state through Redis.")
@click.option(
    "--limiter-fail-mode",
    type=click.Choice(["open", "closed"]),
    default=None,
    help="When Redis is down: admit within a per-process cap (open) or answer 503 (closed).",
)
@click.option(
    "--concurrency-mode",
    type=click.Choice(["reject", "queue"]),
    default=None,
    help="Over the concurrency limit: 429 at once (reject) or wait for a slot (queue).",
)
@click.option(
    "--engine-urls",
    default=None,
    help="Engine servers to use instead of an in-process engine: URL[,URL...] "
    "(http://host:port, or dns+http://name:port for a headless Service).",
)
@engine_options
@click.option("--log-level", default=None, help="DEBUG, INFO, WARNING, ...")
def serve(**flags: Any) -> None:
    """Serve the OpenAI-compatible API; the engine runs on a thread or in a child process."""
    model_flags: tuple[str, ...] = flags.pop("model_flags")
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(model_overrides(model_flags))
    run_server(load_settings(**overrides))


def model_overrides(values: tuple[str, ...]) -> dict[str, Any]:
    """The settings the `--model` flags give: one path (`model`) or NAME=PATH entries
    (`models`). Flags replace the environment's choice, whichever form it used."""
    if not values:
        return {}
    named = ["=" in v for v in values]
    if all(named):
        return {"models": list(values), "model": None}
    if not any(named) and len(values) == 1:
        return {"model": values[0], "models": ()}
    raise click.ClickException(
        "--model: give one PATH, or NAME=PATH for each model (repeatable); not both forms"
        if any(named)
        else "--model PATH can be given once; to serve several models, give NAME=PATH each time"
    )


def load_settings(**overrides: Any) -> Settings:
    """Settings from CLOISTER_* and `overrides`; a bad value is a clear error, not a traceback."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from server.settings.flat_names import refused_values

    try:
        return Settings(**overrides)
    except SettingsError as exc:  # a variable that could not be read, or read twice
        raise click.ClickException(f"invalid settings: {exc}") from None
    except ValidationError as exc:
        # One line, as the CLI writes every error (cloister.cli_context words them alike).
        raise click.ClickException(f"invalid settings: {'; '.join(refused_values(exc))}") from None


def location_flags(settings: Settings) -> str:
    """The CLI flags that reach this server's data from any folder ("" for ./var)."""
    flags = ""
    if settings.data_dir != Settings.model_fields["data_dir"].default:
        flags += f" --data-dir {shlex.quote(str(settings.data_dir.resolve()))}"
    if settings.database_url is not None:
        flags += f" --database-url {shlex.quote(redact_url(settings.database_url))}"
    return flags


def run_server(settings: Settings, *, engine: Any | None = None) -> None:
    """Migrates, wires and serves until stopped: all of `cloister serve` after its flags.

    `engine` may be an already built engine front (benchmarks serve a fake fast model).
    """
    import uvicorn

    from admin.app import with_audit_checkpoints
    from assembly.app import build_app
    from assembly.database import prepare_database
    from assembly.engine_options import (
        DeviceUnavailableError,
        check_model_files,
        serve_engine_options,
    )
    from assembly.lifespan import close_at_shutdown
    from engine.errors import UnsupportedModelError
    from engine.fronts.process_engine import EngineStartError
    from engine.kv_events_endpoint import KVEventsEndpointError
    from gateway.batch_api.blob_factory import check_file_store
    from gateway.batch_api.blob_store import FileStoreConfigError
    from server.logging_setup import configure_logging
    from server.process_tuning import loaded_objects_frozen, short_gil_switch_interval
    from server.telemetry import TelemetryUnavailableError, check_exporter
    from tenancy.secret_pins import SecretMismatchError

    try:
        # A device this machine lacks is refused before anything is made or installed
        # (no file, no log handler).
        if engine is None:
            serve_engine_options(settings)
            check_model_files(settings)
        check_exporter(settings.telemetry.otel_exporter, settings.telemetry.otel_protocol)
        check_file_store(settings)  # a files bucket that cannot be reached, before any model
        configure_logging(settings.telemetry.log_level, fmt=settings.telemetry.log_format)
        first_start = prepare_database(settings)
        app = build_app(settings, engine=engine)
    except (
        DeviceUnavailableError,
        TelemetryUnavailableError,
        KVEventsEndpointError,  # a KV events port that is taken
        EngineStartError,  # the engine process could not build its engine
        SecretMismatchError,  # another key pepper, session or audit key than the database's
        UnsupportedModelError,  # a model file that cannot be read or run, by name
        FileStoreConfigError,  # a files bucket that cannot be used, by bucket and endpoint
    ) as exc:
        raise click.ClickException(str(exc)) from None
    with_audit_checkpoints(app, app.state.admin_services)  # every T s and at shutdown
    # In the lifespan too (see with_audit_checkpoints): usage and last_used_at accepted
    # before a SIGTERM reach the database before the process ends.
    close_at_shutdown(
        app, app.state.metering.close, *(w.close for w in app.state.background_writers)
    )
    if first_start:
        click.echo(
            FIRST_START_HINT.format(
                host=settings.host,
                port=settings.port,
                model=settings.served_models[0].name,
                where=location_flags(settings),
            )
        )
    with loaded_objects_frozen(), short_gil_switch_interval():
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,
            **settings.proxy_header_options(),
        )


commands: list[click.Command] = [serve]
