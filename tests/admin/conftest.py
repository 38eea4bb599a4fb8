"""The `env` fixture: an admin environment (tests/utils/admin_env.py) with two tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tenancy import store
from tests.utils.admin_env import AdminEnv, make_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """A fresh admin environment with tenants "alpha" and "beta"."""
    e = make_env(tmp_path)
    with e.sessions() as s:
        store.create_tenant(s, name="alpha")
        store.create_tenant(s, name="beta")
    yield e
    e.client.close()
