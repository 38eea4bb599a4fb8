"""`cloister serve` records the model it loads in the registry (issue 14 §2, start-up).

Runs the real `build_app` wiring in-process on a tiny model folder.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from admin import registry
from assembly.app import build_app
from server.settings import Settings
from tenancy.db import make_engine, make_session_factory
from tests.utils.built_app import admin_secret, close_app, migrated_sessions
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

OPTIONS: dict[str, Any] = {"attention_backend": "torch", "max_model_len": 256}


def _serve_once(settings: Settings) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Builds the app, reads the registry and the audit through the admin API, shuts down."""
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    headers = {"Authorization": f"Bearer {admin_secret(sessions)}"}
    app = build_app(settings, max_model_len=256)
    with TestClient(app) as client:
        models = client.get("/admin/api/v1/models", headers=headers)
        audit = client.get("/admin/api/v1/audit", params={"limit": 500}, headers=headers)
    close_app(app)
    assert models.status_code == 200 and audit.status_code == 200, (models.text, audit.text)
    served = {m["name"]: m for m in models.json()["items"]}
    events = [e for e in audit.json()["items"] if e["actor"] == "system:serve"]
    return served, events


def test_serve_registers_its_model_as_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = make_tiny_model_dir(tmp_path / "models")
    settings = Settings(
        data_dir=tmp_path,
        key_pepper=PEPPER,
        model=str(folder),
        model_name="tiny",
        attention_backend="torch",
        max_model_len=256,
    )
    sessions = migrated_sessions(settings)
    with sessions() as s:  # left `loaded` by an earlier server that served another model
        registry.register_model(
            s, name="old", source=str(folder), format="safetensors", context_length=64
        )
        registry.update_model(s, name="old", status="loaded")
        old = registry.get_model(s, "old")
        old.device, old.dtype = "cuda", "bfloat16"
        s.commit()

    with caplog.at_level(logging.WARNING, logger="cloister.serve"):
        served, events = _serve_once(settings)
    tiny = served["tiny"]
    assert tiny["status"] == "loaded" and tiny["format"] == "safetensors"
    assert tiny["context_length"] == 256 and tiny["source"] == str(folder.resolve())
    assert tiny["revision"].startswith("sha256-edges:")
    assert (tiny["device"], tiny["dtype"]) == ("cpu", "float32")  # as the engine was built
    assert tiny["price"] is None  # registered by serve: unpriced until a price is set
    assert served["old"]["status"] == "registered"  # not loaded by this server
    assert (served["old"]["device"], served["old"]["dtype"]) == (None, None)
    assert {e["action"] for e in events} == {"model.register", "model.load", "model.unload"}
    assert "has no price" in caplog.text  # unpriced usage is never silently free

    # A second start changes nothing and audits nothing new, until the folder changes.
    again, events_again = _serve_once(settings)
    assert again["tiny"] == tiny and len(events_again) == len(events)
    (folder / "generation_config.json").write_text('{"note": "v2"}')
    changed, _ = _serve_once(settings)
    assert changed["tiny"]["revision"] != tiny["revision"]

    # A price of 0 is a deliberate choice: no warning then.
    with sessions() as s:
        registry.set_price(s, model="tiny", prices=registry.FREE)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cloister.serve"):
        priced, _ = _serve_once(settings)
    assert priced["tiny"]["price"] is not None and "has no price" not in caplog.text
