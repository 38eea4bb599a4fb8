"""The assembled app (`assembly.app.build_app`) served by uvicorn in a thread, as the live
tests over several models run it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from assembly.app import build_app
from server.settings import Settings
from tests.utils.built_app import close_app
from tests.utils.live_gateway import serve_in_thread
from tests.utils.principals import PEPPER


def served_models_settings(data_dir: Path, models: list[str]) -> Settings:
    """Settings for `build_app` serving `models` ("NAME=PATH" each) on the torch backend
    with a small KV pool (256 tokens of context, 8 MiB, 16-token blocks), rows re-read at once."""
    return Settings(
        data_dir=data_dir,
        key_pepper=PEPPER,
        models=models,
        attention_backend="torch",
        max_model_len=256,
        kv_cache_bytes=8 * 1024 * 1024,
        block_size=16,
        config_refresh_s=0.0,
    )


@contextmanager
def served_app(settings: Settings, **serve: float) -> Iterator[tuple[str, Any]]:
    """`build_app(settings)` served by uvicorn in a thread (`serve`: its start and stop
    timeouts); yields its URL and the app, and stops and closes it at the end."""
    app = build_app(settings)
    url, stop = serve_in_thread(app, **serve)
    try:
        yield url, app
    finally:
        stop()
        close_app(app)
