"""The console's overview charts and summary tiles as the API returns them."""

from __future__ import annotations

from pydantic import BaseModel


class SpendPeriod(BaseModel):
    """Requests, prompt plus completion tokens and cost (pico-USD) of a UTC day or month."""

    requests: int
    tokens: int
    cost_pico_usd: int


class EngineLoad(BaseModel):
    """The engines' latest sample: queue and KV cache use (platform roles only)."""

    num_waiting: int | None
    num_running: int | None
    kv_cache_usage: float | None
    sampled_at: str | None


class Summary(BaseModel):
    """The tiles above the charts: the window's figures, today's and the month's spend.

    `requests` counts every request in the window, refused ones (429) included;
    `error_rate` is the share with an HTTP status of 400 or more (None: no requests);
    `prefix_cache_hit_rate` is cached over prompt tokens (None: no prompt tokens).
    A tenant-admin's figures are its tenant's, and its `engine` is None.
    """

    minutes: int
    requests: int
    tokens: int
    errors: int
    error_rate: float | None
    prefix_cache_hit_rate: float | None
    today: SpendPeriod
    month: SpendPeriod
    engine: EngineLoad | None


class Overview(BaseModel):
    """The console's charts: one point per step since `start` (None: no data)."""

    start: str
    step_s: int
    labels: list[str]
    series: dict[str, list[float | None]]
    engine_stats: bool
    truncated: bool
    summary: Summary
