"""GET /metrics: Prometheus exposition of the app's own registry."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.state import app_state

router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
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


@router.get("/health", include_in_schema=False)
async def health() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}
