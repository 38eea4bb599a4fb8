"""`cloister engine serve`: one model's engine as a server for gateways (engine_server).

It takes `serve`'s engine flags and settings (CLOISTER_*), and the service credential
from CLOISTER_SERVICE_TOKEN. Without a credential it refuses to start, unless told
`--insecure-loopback`, which binds 127.0.0.1 only. SIGTERM drains: /health turns 503
and new requests are refused at once, running streams finish (up to
`--drain-timeout-s`), then the process exits.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click

from cloister.commands.engine_flags import engine_options
from cloister.commands.serve import load_settings, model_overrides

LOOPBACK = "127.0.0.1"


@click.group("engine")
def engine() -> None:
    """Run an engine server (the split deployment's engine replica)."""


@engine.command("serve")
@click.option("--host", default=None, help="Interface to bind (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Port to bind (default 8000).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None, help="Data folder.")
@click.option("--model", "model_flags", multiple=True, help="GGUF file or HF folder.")
@click.option("--model-name", default=None, help="The model's name in requests.")
@engine_options
@click.option(
    "--insecure-loopback",
    is_flag=True,
    help="Serve without a service credential, on 127.0.0.1 only (development).",
)
@click.option("--drain-timeout-s", type=click.FloatRange(0, 3600), default=30.0, show_default=True)
@click.option("--log-level", default=None, help="DEBUG, INFO, WARNING, ...")
def serve_engine(**flags: Any) -> None:
    """Serve one model's engine over the internal API (OpenAI completions on token ids)."""
    insecure: bool = flags.pop("insecure_loopback")
    drain_timeout_s: float = flags.pop("drain_timeout_s")
    model_flags: tuple[str, ...] = flags.pop("model_flags")
    if len(model_flags) > 1 or any("=" in m for m in model_flags):
        raise click.ClickException("an engine server serves one model: give --model PATH once")
    overrides = {k: v for k, v in flags.items() if v is not None}
    overrides.update(model_overrides(model_flags))
    settings = load_settings(**overrides)
    token = None if settings.service_token is None else settings.service_token.get_secret_value()
    if not token and not insecure:
        raise click.ClickException(
            "no service credential: set CLOISTER_SERVICE_TOKEN (the gateways use the same), "
            "or pass --insecure-loopback to serve on 127.0.0.1 without one"
        )
    if insecure and not token and settings.host != LOOPBACK:
        raise click.ClickException(
            f"--insecure-loopback serves on {LOOPBACK} only, not on {settings.host}"
        )
    run_engine_server(settings, token=token or None, drain_timeout_s=drain_timeout_s)


def run_engine_server(
    settings: Any, *, token: str | None, drain_timeout_s: float, front: Any | None = None
) -> None:
    """Loads the engine (or serves `front`, an engine front already built: benchmarks serve
    a fake fast model) and serves it until SIGTERM, then drains."""
    import uvicorn

    from assembly.engine_options import DeviceUnavailableError, serve_engine_options
    from assembly.engines import load_engine
    from engine.fronts.process_engine import EngineStartError
    from engine.kv_events_endpoint import KVEventsEndpointError
    from engine_server.app import EngineServer
    from engine_server.auth import ServiceAuth, ServiceTokenError
    from engine_server.link import UVICORN_WS
    from server.logging_setup import configure_logging
    from server.process_tuning import loaded_objects_frozen
    from server.telemetry import TelemetryUnavailableError, check_exporter, provider_from_settings

    try:
        resolved = serve_engine_options(settings)
        auth = ServiceAuth(token)
        check_exporter(
            settings.telemetry.otel_exporter, settings.telemetry.otel_protocol
        )  # before the model loads
    except (DeviceUnavailableError, ServiceTokenError, TelemetryUnavailableError) as exc:
        raise click.ClickException(str(exc)) from None
    configure_logging(settings.telemetry.log_level)
    if front is None:
        try:
            front = load_engine(settings)
        except (KVEventsEndpointError, EngineStartError) as exc:  # e.g. its port is taken
            raise click.ClickException(str(exc)) from None
    # Spans only when something exports them: `engine.generate` under the gateway's trace.
    provider = None
    if settings.telemetry.otel_exporter != "none":
        provider = provider_from_settings(settings, role="engine")
    server = EngineServer(
        front,
        model_name=settings.served_models[0].name,
        auth=auth,
        tracer=None if provider is None else provider.get_tracer("cloister.engine"),
        device=str(resolved["device"]),
        dtype=str(resolved["dtype"]),
        # Pushed adapters go to the temp dir: the data dir is often not writable on an
        # engine pod (read-only root; /tmp is an emptyDir in deploy/kustomize).
        adapter_dir=None,
    )

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which drains the engine on the first signal before shutting
        down: uvicorn closes WebSockets at once when it shuts down, so the link's streams
        (engine_server.link) are waited for first; HTTP streams are waited for by
        uvicorn's own graceful shutdown. A second signal shuts down at once."""

        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            # A signal handler: it may run between any two bytecodes of the loop's thread,
            # so the drain is started by the loop, not here.
            if server.draining or self.loop is None:
                super().handle_exit(sig, frame)
                return
            server.draining = True
            self.loop.call_soon_threadsafe(self._drain, sig, frame)

        def _drain(self, sig: int, frame: Any) -> None:
            async def drain_then_exit() -> None:
                try:
                    await server.drain(drain_timeout_s)
                finally:
                    super(DrainingServer, self).handle_exit(sig, frame)

            self._drainer = asyncio.get_running_loop().create_task(drain_then_exit())

    config = uvicorn.Config(
        server.app(),
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=int(drain_timeout_s),
        ws=UVICORN_WS,  # the link
    )
    try:
        # Not `serve`'s short GIL switch interval: here the engine's thread holds the GIL
        # for most of each step, and handing it over every 0.5 ms cost the link about
        # 0.3 ms of e2e p50 and 0.35 ms of CPU per request (bench/engine_hop.py, A/B).
        with loaded_objects_frozen():
            DrainingServer(config).run()
    finally:
        if provider is not None:
            provider.shutdown()  # flushes the last spans


commands: list[click.Command] = [engine]
