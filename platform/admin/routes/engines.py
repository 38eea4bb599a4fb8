"""GET /engines: each served model's engines (replicas), their pool, load and cache."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from admin.deps import Ctx, allow
from admin.engine_view import EngineReplicas, engines_view
from admin.roles import PLATFORM_READ
from admin.schemas.engines import EnginesView

router = APIRouter(tags=["engines"])


def get_replicas(request: Request) -> EngineReplicas | None:
    """The replica-state reader `mount_console` left on this app, if any."""
    replicas: EngineReplicas | None = getattr(request.app.state, "admin_engine_replicas", None)
    return replicas


Replicas = Annotated[EngineReplicas | None, Depends(get_replicas)]


@router.get("/engines", dependencies=[allow(PLATFORM_READ)])
def list_engines(ctx: Ctx, replicas: Replicas) -> EnginesView:
    """Device, dtype, KV capacity, running and waiting, KV usage and prefix-hit rate of
    every engine replica, per served model."""
    return engines_view(ctx.session, replicas)
