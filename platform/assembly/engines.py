"""Loading the served models' engines: each on a thread of this process or in a child
process, as `engine_mode` says, with a progress bar over the weights on a terminal.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from assembly.engine_options import kv_events_topic, serve_engine_options
from server.logging_setup import LogFormat
from server.settings import Settings

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


def load_engine(
    settings: Settings,
    *,
    factory: Callable[[], LLMEngine] | None = None,
    model: str | None = None,
    **engine_options: Any,
) -> Any:
    """The engine front `settings.engine.engine_mode` asks for.

    "thread": an AsyncEngine whose loop is a thread of this process; "process": a
    ProcessEngine whose loop is a child process (this call waits for it to be ready).
    The engine is `factory()` (picklable, for the child) when given, else `model`
    (None: `settings.model`) with the serve options and `engine_options`.
    """
    options = {**serve_engine_options(settings), **engine_options}
    path = model if model is not None else settings.model
    if settings.engine.engine_mode == "process":
        from engine.fronts.process_engine import ProcessEngine

        return ProcessEngine(
            factory
            or functools.partial(
                build_engine_in_child,
                settings.telemetry.log_level,
                path,
                options,
                log_format=settings.telemetry.log_format,
            )
        )
    from engine.fronts.async_engine import AsyncEngine
    from engine.fronts.scratch_thread import run_on_scratch_thread

    progress = shows_progress(settings.telemetry.log_format)
    # Built off this thread: the engine steps on a thread of its own (see scratch_thread).
    built = run_on_scratch_thread(
        factory or functools.partial(build_engine, path, options, progress=progress)
    )
    return AsyncEngine(built)


def shows_progress(log_format: str) -> bool:
    """Whether model loading draws a progress bar: on a terminal, unless logs are JSON."""
    from server.logging_setup import is_terminal

    return log_format != "json" and is_terminal(sys.stderr)


def build_engine(model: str | None, options: dict[str, Any], *, progress: bool) -> LLMEngine:
    """`LLMEngine.from_options(model, **options)`, with a progress bar over the weights
    when `progress`."""
    import torch

    from engine.engine_builder import build_config
    from engine.llm_engine import LLMEngine
    from engine.model.loader import load_model

    config = build_config(model, **options)
    loaded = load_model(
        config.model.path or None,
        dtype=config.model.dtype,
        device=torch.device(config.model.device),
        progress=progress,
    )
    return LLMEngine(config, loaded)


def load_engines(settings: Settings, **engine_options: Any) -> dict[str, Any]:
    """One engine front per served model (`settings.served_models`), in order, each with
    the same options and its own KV pool and prefix cache.

    On CUDA, without an explicit `kv_cache_bytes`, the models share
    `gpu_memory_utilization`: each engine sizes its pool after measuring what the ones
    loaded before it hold, so engine i of n is allowed (i + 1) / n of the share, and
    each ends with about an equal part. If one fails to load, those already loaded stop.
    """
    specs = settings.served_models
    engines: dict[str, Any] = {}
    try:
        for i, spec in enumerate(specs):
            options = dict(engine_options)
            if settings.engine.kv_events_endpoint is not None:  # each model's events on its topic
                options.setdefault("kv_events_topic", kv_events_topic(settings, spec.name))
            if len(specs) > 1 and "gpu_memory_utilization" not in options:
                options["gpu_memory_utilization"] = (
                    settings.engine.gpu_memory_utilization * (i + 1) / len(specs)
                )
            engines[spec.name] = load_engine(settings, model=spec.path, **options)
    except BaseException:
        for engine in engines.values():
            _stop_unstarted(engine)
        raise
    return engines


def _stop_unstarted(engine: Any) -> None:
    """Stops an engine front `build_app` will not serve (a later model failed to load)."""
    import asyncio

    try:
        asyncio.run(engine.shutdown())
    except Exception:  # best effort: the start-up error is the one to report
        import logging

        logging.getLogger("cloister.serve").exception("stopping a loaded engine failed")


def build_engine_in_child(
    log_level: str,
    model: str | None,
    options: dict[str, Any],
    *,
    log_format: LogFormat = "auto",
) -> LLMEngine:
    """The engine process's factory: the server's log format, then the model."""
    from server.logging_setup import configure_logging

    configure_logging(log_level, fmt=log_format)
    return build_engine(model, options, progress=shows_progress(log_format))
