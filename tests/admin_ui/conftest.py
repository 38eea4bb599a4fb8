"""Fixtures: a live `cloister serve` on a tiny model and a headless Debian chromium (the
server and browser helpers: tests/utils/admin_console.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.utils.admin_console import CHROMIUM, CHROMIUM_ARGS, Server, serve_console
from tests.utils.services import free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `cloister serve` per module: own data dir, tiny random model, audit signing key."""
    yield from serve_console(tmp_path_factory, free_port())


@pytest.fixture(scope="module")
def browser(server: Server) -> Iterator[Any]:
    """Debian's chromium, headless, shared by the module's flows."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()
