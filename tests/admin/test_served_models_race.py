"""Two gateways starting at once on a fresh registry both record the same served model.

One of them reads "no such model", then finds the other's row there when it inserts.
Before the retry, that gateway failed to start on the registry's conflict.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from admin import registry, served_models
from admin.served_models import ServedModel, record_served
from tests.utils.admin_env import AdminEnv, make_env


@pytest.fixture
def env(tmp_path: Path) -> Iterator[AdminEnv]:
    """A fresh admin environment."""
    e = make_env(tmp_path)
    yield e
    e.client.close()


def test_a_model_registered_by_another_gateway_meanwhile_is_recorded_loaded(
    env: AdminEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_register = registry.register_model
    raced: list[str] = []

    def other_gateway_first(session: Any, **fields: Any) -> Any:
        # The other gateway commits the same model between our read and our insert.
        if not raced:
            raced.append(fields["name"])
            with env.sessions() as other:
                real_register(other, **fields)
        return real_register(session, **fields)

    monkeypatch.setattr(served_models.registry, "register_model", other_gateway_first)
    served = ServedModel("local", str(tmp_path), "gguf", 64, "rev1", device="cpu", dtype="float32")
    (row,) = record_served(env.sessions, env.services.audit_writer, served)
    assert raced == ["local"]
    assert (row.name, row.status, row.device) == ("local", "loaded", "cpu")
    with env.sessions() as session:
        assert [m.name for m in registry.list_models(session)] == ["local"]
