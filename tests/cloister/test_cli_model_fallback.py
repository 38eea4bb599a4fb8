"""`cloister models set --fallback-model`: a model's fallback under overload from the
command line (issue 42 item 3), checked like the admin API's and audited."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tenancy.db import make_session_factory
from tests.cloister.test_cli import assert_one_line_error, cli, engine_of, ok_json


@pytest.fixture
def data(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh data folder with models big and small registered."""
    from admin import registry

    folder = str(tmp_path_factory.mktemp("fallback") / "data")
    assert cli("tenants", "create", "acme", "--data-dir", folder).exit_code == 0
    engine = engine_of(folder)
    with make_session_factory(engine)() as s:
        for name in ("big", "small"):
            registry.register_model(s, name=name, source="/m", format="gguf", context_length=512)
    engine.dispose()
    return folder


def test_set_list_and_clear_a_fallback(data: str) -> None:
    from admin.models import AuditEvent

    model = ok_json("models", "set", "big", "--fallback-model", "small", "--data-dir", data)
    assert isinstance(model, dict) and model["fallback_model"] == "small"
    assert model["max_output_tokens"] is None  # only what was given changes
    listed = {m["name"]: m["fallback_model"] for m in ok_json("models", "list", "--data-dir", data)}
    assert listed == {"big": "small", "small": None}
    text = cli("models", "list", "--data-dir", data).stdout
    assert "FALLBACK" in text and any(
        line.startswith("big") and line.endswith("small") for line in text.splitlines()
    )
    said = cli("models", "set", "big", "--fallback-model", "none", "--data-dir", data)
    assert said.exit_code == 0 and "fallback none" in said.stdout
    (cleared,) = ok_json("models", "list", "--data-dir", data)[:1]
    assert cleared["fallback_model"] is None
    engine = engine_of(data)
    with make_session_factory(engine)() as s:
        events = s.scalars(select(AuditEvent).where(AuditEvent.action == "model.update")).all()
        assert [(e.resource, e.detail) for e in events] == [
            ("models/big", {"fallback_model": "small"}),
            ("models/big", {"fallback_model": None}),
        ]
    engine.dispose()


@pytest.mark.parametrize(
    ("model", "fallback", "word"),
    [("big", "ghost", "ghost"), ("big", "big", "own fallback")],
)
def test_bad_fallback_is_one_line(data: str, model: str, fallback: str, word: str) -> None:
    res = cli("models", "set", model, "--fallback-model", fallback, "--data-dir", data)
    assert_one_line_error(res, "fallback_model", word, code=2)
    assert all(m["fallback_model"] is None for m in ok_json("models", "list", "--data-dir", data))


def test_a_cycle_is_one_line(data: str) -> None:
    ok_json("models", "set", "small", "--fallback-model", "big", "--data-dir", data)
    res = cli("models", "set", "big", "--fallback-model", "small", "--data-dir", data)
    assert_one_line_error(res, "cycle", code=2)


def test_set_needs_an_option(data: str) -> None:
    assert_one_line_error(cli("models", "set", "big", "--data-dir", data), "nothing", code=2)
