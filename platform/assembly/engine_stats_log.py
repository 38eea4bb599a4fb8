"""A periodic line per engine, as vLLM prints it: load, KV use, prefix hits, throughput.

    engine tiny: running 2, waiting 0, KV 12.5%, prefix hits 40.0%,
                 prefill 812.0 tok/s, decode 96.3 tok/s

Rates are over the interval since the previous line. An idle engine says so once,
then stays quiet (at DEBUG) until it has work again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine_hop.client import EngineClient, EngineSnapshot
from server.logging_setup import MESSAGE_HAS_FIELDS

logger = logging.getLogger("cloister.engine")


@dataclass(frozen=True)
class EngineLine:
    """One engine's figures over one interval."""

    model: str
    running: int
    waiting: int
    kv_usage_pct: float
    prefix_hit_pct: float | None  # None: nothing looked up in the interval
    prefill_tok_s: float
    decode_tok_s: float

    @property
    def idle(self) -> bool:
        """Nothing running, waiting or computed in the interval."""
        return not (self.running or self.waiting or self.prefill_tok_s or self.decode_tok_s)

    def message(self) -> str:
        """The human-readable line."""
        hits = "-" if self.prefix_hit_pct is None else f"{self.prefix_hit_pct:.1f}%"
        return (
            f"engine {self.model}: running {self.running}, waiting {self.waiting}, "
            f"KV {self.kv_usage_pct:.1f}%, prefix hits {hits}, "
            f"prefill {self.prefill_tok_s:.1f} tok/s, decode {self.decode_tok_s:.1f} tok/s"
        )


def engine_line(
    model: str, now: EngineSnapshot, before: EngineSnapshot | None, elapsed_s: float
) -> EngineLine:
    """The line for `model` between two snapshots `elapsed_s` apart (`before` None: since
    the engine started). A counter that went down means the engine restarted."""

    def delta(a: int, b: int | None) -> int:
        return a - b if b is not None and a >= b else a

    queries = delta(now.prefix_cache_queries, before.prefix_cache_queries if before else None)
    hits = delta(now.prefix_cache_hits, before.prefix_cache_hits if before else None)
    prompt = delta(now.num_prompt_tokens, before.num_prompt_tokens if before else None)
    decode = delta(now.num_generation_tokens, before.num_generation_tokens if before else None)
    span = max(elapsed_s, 1e-9)
    return EngineLine(
        model=model,
        running=now.num_running,
        waiting=now.num_waiting,
        kv_usage_pct=100.0 * now.kv_cache_usage,
        prefix_hit_pct=100.0 * hits / queries if queries else None,
        prefill_tok_s=prompt / span,
        decode_tok_s=decode / span,
    )


class EngineStatsLogger:
    """Logs `engine_line` for every engine each `interval_s`, on the event loop."""

    def __init__(
        self,
        engines: Mapping[str, EngineClient],
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive (0 means: make no logger)")
        self._engines = engines
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, tuple[float, EngineSnapshot]] = {}
        self._was_idle: dict[str, bool] = {}

    def log_once(self) -> list[EngineLine]:
        """Takes a snapshot of each engine and logs its line; returns the lines."""
        lines = []
        for name, engine in self._engines.items():
            if not engine.alive:
                continue
            snap, now = engine.stats(), self._clock()
            last = self._last.get(name)
            line = engine_line(
                name,
                snap,
                last[1] if last else None,
                now - last[0] if last else self.interval_s,
            )
            self._last[name] = (now, snap)
            # An idle engine is reported once; then only at DEBUG, until work arrives.
            quiet = line.idle and self._was_idle.get(name, False)
            self._was_idle[name] = line.idle
            logger.log(
                logging.DEBUG if quiet else logging.INFO,
                line.message(),
                extra={
                    "model": name,
                    "running": line.running,
                    "waiting": line.waiting,
                    "kv_usage_pct": round(line.kv_usage_pct, 2),
                    "prefix_hit_pct": None
                    if line.prefix_hit_pct is None
                    else round(line.prefix_hit_pct, 2),
                    "prefill_tok_s": round(line.prefill_tok_s, 2),
                    "decode_tok_s": round(line.decode_tok_s, 2),
                    "event": "engine_stats",
                    MESSAGE_HAS_FIELDS: True,
                },
            )
            lines.append(line)
        return lines

    async def run(self) -> None:
        """Logs every `interval_s` until cancelled; a failing snapshot is logged, not fatal."""
        try:
            for name, engine in self._engines.items():
                if engine.alive:  # counters start from the moment serving starts
                    self._last[name] = (self._clock(), engine.stats())
        except Exception:
            logger.exception("engine stats line failed")
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.log_once()
            except Exception:
                logger.exception("engine stats line failed")
