"""The models page sets, shows and clears a model's fallback under overload (issue 42
item 3), and shows the API's refusal of a cycle beside the field."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.utils.admin_console import Console, Server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def admin(browser: Any, server: Server) -> Iterator[Console]:
    """The admin's browser context, signed in, with a second model "tiny-b" registered."""
    created = server.api(
        "POST",
        "/models",
        json={
            "name": "tiny-b",
            "source": server.env["CLOISTER_MODEL"],
            "format": "safetensors",
            "context_length": 512,
        },
    )
    assert created.status_code == 201, created.text
    console = Console(browser, server, "fallback")
    console.sign_in(server.admin_token)
    yield console
    console.close()


def _save(admin: Console, model: str, fallback: str) -> Any:
    form = admin.page.get_by_role("form", name="Model fallback")
    form.get_by_label("Model", exact=True).select_option(model)
    form.get_by_label("Fallback model").select_option(fallback)
    form.get_by_role("button", name="Save fallback").click()
    return form


def _table_width(admin: Console) -> int:
    table = admin.page.get_by_role("table", name="Models")
    width: int = admin.page.locator(".table-wrap", has=table).evaluate("(w) => w.scrollWidth")
    return width


def test_models_page_sets_shows_and_clears_a_fallback(admin: Console) -> None:
    page, server = admin.page, admin.server
    admin.go("/models")
    width = _table_width(admin)
    _save(admin, "tiny", "tiny-b")
    page.locator("#banner", has_text="tiny: fallback tiny-b").wait_for()
    assert server.api("GET", "/models/tiny").json()["fallback_model"] == "tiny-b"
    row = page.get_by_role("table", name="Models").locator("tbody tr", has_text="tiny").first
    expect(row).to_contain_text("fallback: tiny-b")
    # Shown under the name, wrapping: the table grows no wider (at 1280 px it just fits).
    assert _table_width(admin) <= width
    admin.shot("models-fallback-set")
    # The form shows the chosen model's fallback as it stands.
    form = page.get_by_role("form", name="Model fallback")
    form.get_by_label("Model", exact=True).select_option("tiny")
    expect(form.get_by_label("Fallback model")).to_have_value("tiny-b")

    # tiny-b -> tiny would close a cycle: the API's 400 shows beside the field.
    form = _save(admin, "tiny-b", "tiny")
    error_id = form.get_by_label("Fallback model").get_attribute("aria-describedby")
    expect(form.locator(f"#{error_id}")).to_contain_text("cycle")
    assert server.api("GET", "/models/tiny-b").json()["fallback_model"] is None

    _save(admin, "tiny", "")
    page.locator("#banner", has_text="tiny: fallback none").wait_for()
    assert server.api("GET", "/models/tiny").json()["fallback_model"] is None
    admin.assert_no_errors(allowed=("400",))
