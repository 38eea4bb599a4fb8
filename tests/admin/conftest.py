"""The `env` fixture: an admin environment (tests/utils/admin_env.py) with two tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.utils.admin_env import AdminEnv
from tests.utils.admin_seed import env_with_tenants


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """A fresh admin environment with tenants "alpha" and "beta"."""
    yield from env_with_tenants(tmp_path, "alpha", "beta")
