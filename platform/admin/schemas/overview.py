"""The console's overview charts as the API returns them."""

from __future__ import annotations

from pydantic import BaseModel


class Overview(BaseModel):
    """The console's charts: one point per step since `start` (None: no data)."""

    start: str
    step_s: int
    labels: list[str]
    series: dict[str, list[float | None]]
    engine_stats: bool
    truncated: bool
