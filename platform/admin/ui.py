"""The admin console at /admin: static pages and scripts from admin_ui/, chart.js from npm.

The console is static HTML and small JavaScript modules that call the admin API
with the signed-in caller's bearer token; it has no server-side powers of its
own; its API routes are the admin router's (admin/router.py). `mount_console` starts
the sampler the overview route reads engine counters from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from admin.deps import AdminServices
from admin.engine_view import EngineReplicas
from admin.overview_stats import EngineStats, StatsSampler

if TYPE_CHECKING:
    from engine_hop.replicas import ReplicaState

DEFAULT_UI_DIR = Path(__file__).resolve().parents[2] / "admin_ui"
CHART_JS = Path("node_modules/chart.js/dist/chart.umd.min.js")
# Everything from this origin and nothing else: no CDN can sneak in, no inline script runs.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def gateway_engine_stats(state: Any) -> EngineStats:
    """A stats callable over a gateway AppState: its engines' snapshots (cache counters
    summed over the served models, KV usage their mean) plus limiter rejections."""

    def read() -> Mapping[str, float]:
        snaps = [engine.stats() for engine in state.engines.values()]
        rejected = 0.0
        for metric in state.metrics.limiter_rejections.collect():
            rejected += sum(s.value for s in metric.samples if s.name.endswith("_total"))
        return {
            "kv_cache_usage": sum(float(s.kv_cache_usage) for s in snaps) / len(snaps),
            "prefix_cache_queries": float(sum(s.prefix_cache_queries for s in snaps)),
            "prefix_cache_hits": float(sum(s.prefix_cache_hits for s in snaps)),
            "rate_limit_rejections": rejected,
            "num_waiting": float(sum(s.num_waiting for s in snaps)),
            "num_running": float(sum(s.num_running for s in snaps)),
        }

    return read


def gateway_engine_replicas(state: Any) -> EngineReplicas:
    """A replica-state reader over a gateway AppState: each served model's engines."""

    def read() -> Mapping[str, Sequence[ReplicaState]]:
        return {name: client.replica_states() for name, client in state.engines.items()}

    return read


# Adapter name -> {"state": "device" | "host" | "disk" | "loaded" | "not_loaded",
# "requests": n}.
AdapterRuntime = Callable[[], Mapping[str, Mapping[str, Any]]]


def gateway_adapter_runtime(state: Any) -> AdapterRuntime:
    """What the gateway's engines say of each adapter (loaded on the device, in host
    memory, or loaded where the engine does not say) and its finished requests."""

    def read() -> Mapping[str, Mapping[str, Any]]:
        counts: dict[str, int] = state.metrics.adapters.request_counts()
        out: dict[str, dict[str, Any]] = {
            name: {"state": "not_loaded", "requests": n} for name, n in counts.items()
        }
        for engine in state.engines.values():
            for info in engine.adapters():
                entry = out.setdefault(info.name, {"state": "not_loaded", "requests": 0})
                entry["state"] = info.location or "loaded"
        return out

    return read


def mount_console(
    app: FastAPI,
    services: AdminServices,
    *,
    engine_stats: EngineStats | Callable[[], Mapping[str, float]] | None = None,
    engine_replicas: EngineReplicas | None = None,
    adapter_runtime: AdapterRuntime | None = None,
    sample_every_s: float = 10.0,
    ui_dir: Path = DEFAULT_UI_DIR,
) -> StatsSampler | None:
    """Serves the console at /admin and its API routes; returns the started sampler, if any.

    The caller owns the sampler: call `stop()` on shutdown (it is a daemon thread,
    so a process that just exits needs nothing).
    """
    sampler = None
    if engine_stats is not None:
        sampler = StatsSampler(engine_stats)
        if sample_every_s > 0:
            sampler.start(sample_every_s)
    app.state.admin_stats_sampler = sampler  # read by GET /overview (admin/routes/overview.py)
    app.state.admin_engine_replicas = engine_replicas  # read by GET /engines
    app.state.admin_adapter_runtime = adapter_runtime  # read by GET /adapters/runtime
    index = ui_dir / "index.html"

    def page() -> Response:
        return FileResponse(index, media_type="text/html", headers=PAGE_HEADERS)

    @app.get("/admin", include_in_schema=False)
    def console_root() -> Response:
        """The console's single page (the hash picks the view)."""
        return page()

    @app.get("/admin/", include_in_schema=False)
    def console_slash() -> Response:
        """/admin/ goes to /admin so relative links resolve one way."""
        return RedirectResponse("/admin", status_code=307)

    @app.get("/admin/oidc", include_in_schema=False)
    def console_oidc() -> Response:
        """OIDC redirect target: the page finishes sign-in through the API's callback."""
        return page()

    @app.get("/admin/vendor/chart.umd.min.js", include_in_schema=False)
    def chart_js() -> Response:
        """chart.js as installed from the npm registry by scripts/bootstrap."""
        path = ui_dir / CHART_JS
        if not path.is_file():
            raise HTTPException(404, "chart.js missing: run scripts/bootstrap (npm ci in admin_ui)")
        return FileResponse(
            path, media_type="text/javascript", headers={"Cache-Control": "max-age=3600"}
        )

    app.mount("/admin/static", StaticFiles(directory=ui_dir / "static"), name="admin-static")
    return sampler
