"""GET /metrics: Prometheus exposition of the app's own registry."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.state import app_state


async def metrics(request: Request) -> Response:
    """The gateway's and the engine's series, engine gauges refreshed now."""
    state = app_state(request)
    snap = state.engine.stats()
    # Limiters with a shared backend count their own failures; in-memory ones have none.
    errors = getattr(state.limits.limiter, "backend_errors", None)
    text = state.metrics.render(
        snap, limiter_backend_errors=errors if isinstance(errors, int) else None
    )
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def health(request: Request) -> JSONResponse:
    """Liveness: the process answers and its engine serves (503 once the engine died, so
    that an orchestrator restarts the server instead of routing tenants to it)."""
    if not app_state(request).engine.alive:
        return JSONResponse({"status": "engine_unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


routes = [
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
