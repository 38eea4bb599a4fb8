"""The dashboard flows (overview tiles, tenant spend and budget, admin tokens), run from
test_console_flows.py on its server so that no second `cloister serve` is started."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from admin.usage_store import write_usage
from tenancy.db import make_engine, make_session_factory
from tests.utils.admin_console import Console, Server
from tests.utils.admin_seed import usage_row

SEEDED = "initech"
# $1, $0.50 and $2 per million tokens: pico-USD per token (= micro-USD per million).
PRICE = {"input_price": 1_000_000, "cached_input_price": 500_000, "output_price": 2_000_000}
# Three served requests of 100 prompt (40 cached) + 20 completion tokens, and one 500:
# 3 x (60e6 + 20e6 + 40e6) pico-USD = $0.000360; tokens 360; hit rate 120/300.
SEEDED_COST = "$0.000360"
BUDGET = 400  # 360 of 400 tokens used: 90 %, a warning


def seed_usage(server: Server) -> dict[str, Any]:
    """A priced "tiny", tenant initech with one key and four usage rows written just now."""
    tenant = server.api("POST", "/tenants", json={"name": SEEDED}).json()
    key = server.api("POST", f"/tenants/{SEEDED}/keys", json={"name": "seeded"}).json()
    now = dt.datetime.now(dt.UTC)
    since = (now - dt.timedelta(minutes=1)).isoformat()
    priced = server.api("POST", "/models/tiny/prices", json={**PRICE, "effective_from": since})
    assert priced.status_code == 201, priced.text
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    when = max(now - dt.timedelta(seconds=2), midnight).isoformat()

    def row(**fields: Any) -> dict[str, Any]:
        request = {"request_id": f"seed-{uuid.uuid4()}", "key_id": key["id"], "ttft_s": 0.05}
        tokens = {"prompt_tokens": 100, "cached_tokens": 40, "completion_tokens": 20}
        return usage_row(tenant["id"], when, **{**request, **tokens, "latency_s": 0.4, **fields})

    rows = [row(), row(), row()]
    rows.append(row(status=500, prompt_tokens=0, cached_tokens=0, completion_tokens=0))
    db = Path(server.env["CLOISTER_DATA_DIR"]) / "cloister.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with make_session_factory(engine)() as s:
            assert write_usage(s, rows) == 4
    finally:
        engine.dispose()
    limits = server.api("PUT", f"/tenants/{SEEDED}/limits", json={"token_budget": BUDGET})
    assert limits.status_code == 200, limits.text
    return {"tenant": tenant, "key": key}


def tile(c: Console, name: str) -> str:
    """A summary tile's figure."""
    return c.page.locator(f"#tile-{name} .kpi").inner_text()


def overview_requests(c: Console) -> list[str]:
    """Collects the URLs of the page's GET /overview calls from now on."""
    seen: list[str] = []
    c.page.on("request", lambda r: seen.append(r.url) if "/api/v1/overview" in r.url else None)
    return seen


def check_admin_tiles_and_range(c: Console) -> None:
    """Tiles equal the API's summary; the range picker changes the request and is kept."""
    server, page = c.server, c.page
    c.go("/overview")
    summary = server.api("GET", "/overview", params={"minutes": 60, "step_s": 60}).json()["summary"]
    assert tile(c, "requests") == f"{summary['requests']:,}"
    assert summary["requests"] >= 4 and summary["today"]["tokens"] >= 360
    assert tile(c, "tokens") == f"{summary['tokens']:,}"
    engine = summary["engine"]
    assert engine is not None
    queue = tile(c, "queue")
    if engine["num_waiting"] is None:
        assert queue == "—"
    else:
        assert queue == f"{engine['num_waiting']} / {engine['num_running']}"
    assert "%" in tile(c, "kv") or tile(c, "kv") == "—"
    with page.expect_request(lambda r: "/api/v1/overview" in r.url) as info:
        page.get_by_label("Time range").select_option("6h")
    assert "minutes=360" in info.value.url and "step_s=300" in info.value.url
    expect(page.locator("#tile-requests h2")).to_have_text("Requests (6 h)")
    c.go("/overview")  # a reload keeps the range (localStorage)
    assert page.get_by_label("Time range").input_value() == "6h"
    expect(page.locator("#tile-requests h2")).to_have_text("Requests (6 h)")
    page.get_by_label("Time range").select_option("1h")  # the screenshots' default again
    expect(page.locator("#tile-requests h2")).to_have_text("Requests (1 h)")


def check_tenant_admin_tiles_and_refresh(c: Console, token: str) -> None:
    """A tenant-admin's tiles are exactly its seeded rows; auto-refresh re-fetches on the
    (fake) clock and stops when switched off."""
    page = c.page
    page.clock.install()
    c.sign_in(token)
    c.go("/overview")
    assert tile(c, "requests") == "4" and tile(c, "tokens") == "360"
    assert tile(c, "error-rate") == "25.0 %" and tile(c, "hit-rate") == "40.0 %"
    assert tile(c, "spend-today") == SEEDED_COST and tile(c, "spend-month") == SEEDED_COST
    assert page.locator("#tile-queue, #tile-kv").count() == 0  # platform-wide figures
    seen = overview_requests(c)
    page.get_by_label("Auto-refresh").select_option("10")
    page.clock.run_for(10_500)
    _wait_for(lambda: len(seen) >= 1, page)
    page.clock.run_for(10_000)
    _wait_for(lambda: len(seen) >= 2, page)
    page.get_by_label("Auto-refresh").select_option("0")
    before = len(seen)
    page.clock.run_for(35_000)
    page.wait_for_timeout(300)
    assert len(seen) == before, seen
    assert tile(c, "requests") == "4"


def _wait_for(cond: Any, page: Any, timeout_ms: int = 5000) -> None:
    for _ in range(timeout_ms // 50):
        if cond():
            return
        page.wait_for_timeout(50)
    raise AssertionError("timed out")


def check_tenant_spend_budget_and_keys(c: Console, key: dict[str, Any]) -> None:
    """The seeded tenant's page: spend today and this month, the budget warning, per-key use."""
    page = c.page
    c.go(f"/tenants/{SEEDED}")
    today = page.locator("#tenant-spend-today")
    expect(today.locator(".kpi")).to_have_text(SEEDED_COST)
    assert "4 requests · 360 tokens" in today.inner_text()
    expect(page.locator("#tenant-spend-month .kpi")).to_have_text(SEEDED_COST)
    budget = page.locator("#tenant-budget")
    assert "warning" in (budget.get_attribute("class") or "").split()
    assert "90.0 % used" in budget.inner_text() and "near the limit" in budget.inner_text()
    assert f"360 of {BUDGET:,} tokens this month" in budget.inner_text()
    per_key = page.get_by_role("table", name="Usage per key")
    cells = per_key.locator("tbody tr").first.locator("td").all_inner_texts()
    assert cells == [f"{key['prefix']}… seeded", "4", "360", SEEDED_COST], cells
    page.get_by_label("Key usage period").select_option("today")
    expect(per_key.locator("tbody tr").first.locator("td").nth(1)).to_have_text("4")


def check_tokens_create_once_and_revoke(c: Console) -> None:
    """Create a viewer token (secret once, copy button, warning), then revoke it."""
    server, page = c.server, c.page
    c.go("/tokens")
    page.get_by_label("Token name").fill("dash-viewer")
    page.get_by_label("Role").select_option("viewer")
    assert not page.get_by_label("Tenant").is_visible()  # only for tenant-admin tokens
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token-secret").inner_text().strip()
    assert "will not be shown again" in page.locator("#token-secret-slot").inner_text()
    assert page.get_by_role("button", name="Copy").is_visible()
    who = server.api("GET", "/whoami", token=secret)
    assert who.status_code == 200 and who.json()["role"] == "viewer"
    tokens = server.api("GET", "/tokens").json()["items"]
    (mine,) = [t for t in tokens if t["name"] == "dash-viewer"]
    assert secret.startswith(mine["prefix"])
    table = page.get_by_role("table", name="Admin tokens")
    expect(table.get_by_text("(this sign-in)")).to_have_count(1)  # the admin's own token
    row = table.locator("tbody tr", has_text="dash-viewer")
    assert row.locator("td").nth(1).inner_text() == "viewer"
    c.go("/tokens")  # shown once: not after a reload
    assert page.locator("#new-token-secret").count() == 0 and secret not in page.content()
    page.get_by_role("button", name=f"Revoke token {mine['prefix']}").click()
    dialog = page.locator("dialog#confirm")
    dialog.wait_for()
    dialog.get_by_role("button", name="Revoke token", exact=True).click()
    page.locator("#banner", has_text="is revoked").wait_for()
    expect(row.locator(".status")).to_have_text("revoked")
    assert row.get_by_role("button", name="Revoke").count() == 0
    assert server.api("GET", "/whoami", token=secret).status_code == 401
    # A tenant-admin token names its tenant in the list.
    page.get_by_label("Role").select_option("tenant-admin")
    page.get_by_label("Tenant").select_option(SEEDED)
    page.get_by_label("Token name").fill("dash-ta")
    page.get_by_role("button", name="Create token").click()
    page.locator("#new-token-secret").wait_for()
    ta_row = table.locator("tbody tr", has_text="dash-ta")
    expect(ta_row.locator("td").nth(2)).to_have_text(SEEDED)


def check_viewer_reads_tokens(c: Console, token: str) -> None:
    """A viewer sees the list, and no create or revoke buttons."""
    c.sign_in(token)
    assert "Admin tokens" in c.page.locator("#nav").inner_text()
    c.go("/tokens")
    c.page.get_by_role("table", name="Admin tokens").wait_for()
    for name in ("Create token", "Revoke"):
        assert c.page.get_by_role("button", name=name).count() == 0, name
    assert "only an admin can create or revoke" in c.page.locator("main").inner_text()


def overview_and_tenant_spend(admin: Console, browser: Any) -> None:
    """Seeded usage: the admin's tiles and range picker, the tenant page's spend, budget
    warning and usage per key, then a tenant-admin's exact tiles and auto-refresh."""
    seeded = seed_usage(admin.server)
    check_admin_tiles_and_range(admin)
    check_tenant_spend_budget_and_keys(admin, seeded["key"])
    admin.shot("14-tenant-spend")
    admin.assert_no_errors()
    body = {"role": "tenant-admin", "tenant": SEEDED}
    token = admin.server.api("POST", "/tokens", json=body).json()["token"]
    c = Console(browser, admin.server, "seeded-tenant-admin")
    try:
        check_tenant_admin_tiles_and_refresh(c, token)
        c.shot("15-tenant-admin-tiles")
        c.assert_no_errors()
    finally:
        c.close()


def admin_tokens(admin: Console, browser: Any) -> None:
    """The admin creates and revokes tokens; a viewer reads the list only."""
    check_tokens_create_once_and_revoke(admin)
    admin.shot("16-admin-tokens")
    admin.assert_no_errors()
    token = admin.server.api("POST", "/tokens", json={"role": "viewer"}).json()["token"]
    c = Console(browser, admin.server, "viewer-tokens")
    try:
        check_viewer_reads_tokens(c, token)
        c.assert_no_errors()
    finally:
        c.close()
