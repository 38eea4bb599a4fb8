"""Engines the admin tests read figures from: an in-process front with fixed stats, and
an engine server's /internal/info and /internal/stats on loopback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

from admin.ui import gateway_engine_replicas
from engine.stats import EngineStats
from engine_hop.replica_set import ReplicaSetClient
from tests.utils.admin_env import AdminEnv
from tests.utils.byte_tokenizer import ByteTokenizer

REMOTE_INFO = {
    "model_name": "remote",
    "max_model_len": 128,
    "vocab_size": 256,
    "num_blocks": 100,
    "block_size": 8,
}

# GET /engines' `speculative` figures of an engine that proposed 8 drafts of 4 tokens and
# had 20 of them accepted (8, 6, 4 and 2 at the four positions).
SPECULATIVE_FIGURES: dict[str, Any] = {
    "num_drafts": 8,
    "num_draft_tokens": 32,
    "num_accepted_tokens": 20,
    "accepted_per_pos": [8, 6, 4, 2],
    "acceptance_rate": 0.625,
    "mean_accepted_length": 3.5,
}


def idle_stats(**fields: Any) -> EngineStats:
    """An engine's stats over a pool of 40 blocks of 16, nothing running; `fields` differ."""
    values: dict[str, Any] = {
        "num_running": 0,
        "num_waiting": 0,
        "kv_cache_usage": 0.0,
        "prefix_cache_queries": 0,
        "prefix_cache_hits": 0,
        "num_preemptions": 0,
        "num_blocks": 40,
        "block_size": 16,
    }
    return EngineStats(**{**values, **fields})


class FixedStatsEngine:
    """An engine front's surface as InProcessEngineClient reads it, with fixed stats."""

    model_name = "local"
    max_model_len = 64
    vocab_size = 256
    tokenizer = ByteTokenizer()
    alive = True

    def __init__(self, stats: EngineStats) -> None:
        self._stats = stats

    def stats(self) -> EngineStats:
        """The stats given at construction."""
        return self._stats


def remote_engine_server(stats: dict[str, Any]) -> tuple[ThreadingHTTPServer, str]:
    """An engine server answering /internal/info (REMOTE_INFO) and /internal/stats
    (`stats`) on loopback; returns it and its address."""
    bodies = {"/internal/info": REMOTE_INFO, "/internal/stats": stats}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(bodies[self.path]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}"


def polled_replica_set(urls: Sequence[str]) -> ReplicaSetClient:
    """A replica set named "remote" over the engine servers at `urls`, each replica
    polled once (its pool and load read) and its HTTP client closed again."""
    remote = ReplicaSetClient(
        list(urls), token=None, tokenizer=ByteTokenizer(), model_name="remote"
    )

    async def poll() -> None:
        for replica in remote.replicas():
            await replica.poll_once()
            await replica.http.aclose()

    asyncio.run(poll())
    return remote


def connect_engines(
    env: AdminEnv, engines: Mapping[str, Any], remote_urls: Sequence[str] = ()
) -> None:
    """Wires the admin app to a gateway's engine clients (name -> client), as
    `cloister serve` does; with `remote_urls`, also to a replica set "remote" over the
    engine servers there (`polled_replica_set`)."""
    if remote_urls:
        engines = {**engines, "remote": polled_replica_set(remote_urls)}
    env.client.app.state.admin_engine_replicas = gateway_engine_replicas(  # type: ignore[attr-defined]
        SimpleNamespace(engines=engines)
    )
