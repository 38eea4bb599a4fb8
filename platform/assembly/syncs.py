"""The syncs that carry the registry's changes to each running engine within
`config_refresh_s`, like limits: tenant cache policies and published prefixes, and the
registered adapters. One of each per model: a published prefix belongs to one model and
is tokenized by its tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from assembly.adapter_sync import AdapterSync
from assembly.cache_rules_sync import CacheRulesSync
from assembly.periodic_sync import run_while_serving
from server.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from sqlalchemy.orm import Session, sessionmaker

    from engine_hop.client import EngineClient


def start_syncs(
    app: FastAPI,
    clients: Mapping[str, EngineClient],
    sessions: sessionmaker[Session],
    settings: Settings,
) -> None:
    """Each model's cache rules and adapter syncs, run while `app` serves (on `sessions`,
    the background writers' pool) and kept on `app.state` for the tests and the CLI."""
    interval_s = settings.gateway.config_refresh_s
    app.state.cache_rules_syncs = {
        name: CacheRulesSync(client, sessions, interval_s=interval_s)
        for name, client in clients.items()
    }
    app.state.adapter_syncs = {
        name: AdapterSync(client, sessions, interval_s=interval_s)
        for name, client in clients.items()
    }
    for sync in (*app.state.cache_rules_syncs.values(), *app.state.adapter_syncs.values()):
        run_while_serving(app, sync)
