"""The admin service's half of `cloister serve`: its services and the metering sink
before the gateway, and its API, console and document mounted on the gateway's app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from assembly.pools import DatabasePools
from server.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from admin.deps import AdminServices
    from admin.metering import MeteringSink


@dataclass(frozen=True)
class AdminParts:
    """What the gateway needs of the admin service: its services (audit, sessions) and
    the sink tenant usage is metered into."""

    services: AdminServices
    metering: MeteringSink


def build_admin(settings: Settings, pools: DatabasePools) -> AdminParts:
    """The admin services and the started metering sink. The sink starts first: it
    replays a spool a killed process left into the ledger, from which the limiter then
    seeds its budget counters."""
    from admin.app import make_services
    from admin.metering import MeteringSink
    from admin.settings import AdminSettings

    admin_settings = AdminSettings.from_settings(settings)
    services = make_services(
        pools.admin,
        pepper=settings.key_pepper.get_secret_value(),
        settings=admin_settings,
        audit_sessions=pools.writers,
    )
    metering = MeteringSink(pools.writers, admin_settings.spool_path).start()
    return AdminParts(services, metering)


def mount_admin(app: FastAPI, services: AdminServices) -> None:
    """The admin API, its console (over the gateway's engines) and its own OpenAPI
    document, served by the gateway's process."""
    from admin.openapi import install_admin_openapi
    from admin.router import create_admin_router
    from admin.ui import (
        gateway_adapter_runtime,
        gateway_engine_replicas,
        gateway_engine_stats,
        mount_console,
    )

    app.include_router(create_admin_router(services))
    mount_console(
        app,
        services,
        engine_stats=gateway_engine_stats(app.state.cloister),
        engine_replicas=gateway_engine_replicas(app.state.cloister),
        adapter_runtime=gateway_adapter_runtime(app.state.cloister),
    )
    install_admin_openapi(app)  # apart from the tenant API's document
    app.state.admin_services = services  # run_server runs its audit checkpoint timer
