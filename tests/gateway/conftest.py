"""The `gateway` fixture: a live gateway (tests/utils/live_gateway.py) with the in-memory limiter.

The engine is the real AsyncEngine over a tiny random-weight model; set
CLOISTER_GATEWAY_TEST_ENGINE=fake to run the same engine over the fast fake model
(tests/utils/fast_fake_model.py) instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tenancy.limiter.memory import MemoryLimiter
from tests.utils.live_gateway import LiveGateway, make_test_engine, start_gateway


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LiveGateway]:
    """A live gateway with the in-memory limiter."""
    gw, stop = start_gateway(tmp_path, engine=make_test_engine(tmp_path), limiter=MemoryLimiter())
    yield gw
    stop()
