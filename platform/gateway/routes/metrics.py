"""GET /metrics: Prometheus exposition of the app's own registry.

Anonymous scrapes get the engine-level series only (vllm:*, limiter backend errors):
nothing in them names a tenant. Tenant-labelled series (cloister_requests,
cloister_limiter_rejections, cloister_tenant_kv_blocks_in_use,
cloister_tenant_preemptions_{suffered,caused}_total) and the engine replicas' (cloister_engine_replica_*,
named by internal addresses) need an operator credential in the Authorization header,
checked by the app's `operator_auth` (an admin or viewer admin token in `cloister
serve`); a credential that is refused is a 401, not a silent public answer.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.errors import error_response
from gateway.state import app_state


async def metrics(request: Request) -> Response:
    """The gateway's and the engine's series, engine gauges refreshed now."""
    state = app_state(request)
    credential = request.headers.get("authorization")
    include_tenants = False
    if credential is not None:
        check = state.operator_auth
        # The check may read the database: off the event loop.
        if check is None or not await run_in_threadpool(check, credential):
            return error_response(
                401,
                "tenant metrics need an operator (admin or viewer) admin token",
                type_="invalid_request_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        include_tenants = True
    snaps = {name: engine.stats() for name, engine in state.engines.items()}
    # Limiters with a shared backend count their own failures; in-memory ones have none.
    errors = getattr(state.limits.limiter, "backend_errors", None)
    # Engine servers (`--engine-urls`): each one's state, shown to operators only.
    replicas = (
        {name: engine.replica_states() for name, engine in state.engines.items()}
        if include_tenants
        else None
    )
    text = state.metrics.render(
        snaps,
        limiter_backend_errors=errors if isinstance(errors, int) else None,
        include_tenants=include_tenants,
        replicas=replicas,
    )
    return Response(text, media_type=CONTENT_TYPE_LATEST)


async def health(request: Request) -> JSONResponse:
    """Liveness: the process answers and its engines serve (503 once one of them died, so
    that an orchestrator restarts the server instead of routing tenants to it)."""
    if not all(engine.alive for engine in app_state(request).engines.values()):
        return JSONResponse({"status": "engine_unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


routes = [
    Route("/metrics", metrics, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]
