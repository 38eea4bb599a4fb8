"""`build_app`: one `cloister serve` app, from the engines to the admin console.

The CLI's `serve` command only parses flags and runs uvicorn over it. The order
matters: the database pools before any connection, the admin services and metering
sink before the limiter (which seeds its budgets from the ledger), the served models
recorded before the gateway first reads the allow-lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from assembly.admin_builder import build_admin, mount_admin
from assembly.engine_options import serve_engine_options
from assembly.gateway_builder import build_gateway, engine_clients
from assembly.lifespan import with_server_logs
from assembly.pools import open_pools
from assembly.served_models import record_served_models
from assembly.syncs import start_syncs
from server.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI


def build_app(settings: Settings, *, engine: Any | None = None, **engine_options: Any) -> FastAPI:
    """The wired gateway: authenticator on the database, limiter from settings, engines
    in-process.

    `engine` may be an already built engine front (tests, benchmarks), served as the one
    model `settings.model_name`; otherwise one engine per `settings.served_models` is
    loaded (the default: the bundled SmolLM2) with `engine_options`, each on a thread or
    in a child process as `settings.engine.engine_mode` says, and recorded in the registry.
    """
    # A given engine (tests, benchmarks) or remote engines: no model file is loaded here.
    loads_model = engine is None and not settings.gateway.engine_urls
    clients = engine_clients(settings, engine, engine_options)
    resolved = {**serve_engine_options(settings), **engine_options} if loads_model else {}
    pools = open_pools(settings)
    admin = build_admin(settings, pools)
    if engine is None:  # before the allow-lists are first read: it may register the model
        # Over engine servers too (the gateway reads the same model files for its
        # tokenizer), so adapters can name the base at once; each replica reports its
        # own device and dtype (the Engines view), so the registry names none then.
        record_served_models(
            admin.services,
            [(spec, clients[spec.name].max_model_len) for spec in settings.served_models],
            device=str(resolved["device"]) if loads_model else None,
            dtype=str(resolved["dtype"]) if loads_model else None,
        )
    app, last_used = build_gateway(settings, clients, pools, admin)
    mount_admin(app, admin.services)  # one process serves the admin API beside the gateway
    start_syncs(app, clients, pools.writers, settings)
    app.state.background_writers = (last_used, admin.services.audit_writer)
    with_server_logs(app, settings, engine_options=resolved)
    return app
