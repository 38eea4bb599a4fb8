"""The admin console in a real browser against a live `cloister serve`.

The flows build on each other in file order (one server per module): sign in,
create a tenant, set limits, create a key, use it, see the usage, export billing,
revoke it, check tenant-admin isolation, and check the audit page.
"""

from __future__ import annotations

import csv
import io
import json
import re
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
from playwright.sync_api import expect

from admin.audit_chain import load_private_key, public_hex
from admin.audit_file import verify_export
from tests.admin_ui import dashboards
from tests.utils.admin_console import SIGNING_KEY, Console, Server, screenshot_dir, utc_month

pytestmark = pytest.mark.browser

# Each chart dataset's label and colour, for one palette across pages.
COLOURS = (
    "(sel) => Object.fromEntries(document.querySelector(sel).chart.data.datasets"
    ".map((d) => [d.label, d.backgroundColor]))"
)
CACHE_SPLIT = {"cached prompt tokens", "uncached prompt tokens"}
NO_PICKERS = "input[type=date], input[type=datetime-local], input[type=month]"

TENANT = "acme"
OTHER = "globex"


@pytest.fixture(scope="module")
def admin(browser: Any, server: Server) -> Iterator[Console]:
    """The admin's browser context, shared by the admin flows."""
    console = Console(browser, server, "admin")
    yield console
    console.close()


def _client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0)


def test_sign_in_as_admin(admin: Console) -> None:
    admin.sign_in(admin.server.admin_token)
    page = admin.page
    assert page.locator("#who-text").inner_text().endswith("admin")
    nav = page.locator("#nav").inner_text()
    for section in (
        "Overview",
        "Tenants",
        "Keys",
        "Models & adapters",
        "Usage & billing",
        "Audit log",
    ):
        assert section in nav
    page.wait_for_selector("#chart-rps")
    admin.shot("01-signed-in-overview")
    admin.assert_no_errors()


def test_sign_in_refuses_a_wrong_token_in_plain_words(browser: Any, server: Server) -> None:
    c = Console(browser, server, "wrong-token")
    try:
        c.page.goto(server.base_url + "/admin")
        c.page.get_by_label("Admin token").wait_for()
        # Nobody is signed in: no "Sign out" button (CSS `display: flex` beat `hidden`).
        assert not c.page.get_by_role("button", name="Sign out").is_visible()
        c.page.get_by_label("Admin token").fill("clo-adm-not-a-real-token")
        c.page.get_by_role("button", name="Sign in with token").click()
        error = c.page.locator(".field .error")
        error.wait_for()
        # A wrong token is not an expired sign-in.
        assert "That token is not valid" in error.inner_text()
        assert "expired" not in error.inner_text()
        assert not c.page.get_by_role("button", name="Sign out").is_visible()
        c.shot("wrong-token")
        c.assert_no_errors(allowed=("status of 401",))
    finally:
        c.close()


def test_create_tenant(admin: Console) -> None:
    admin.go("/tenants")
    page = admin.page
    page.get_by_label("Name", exact=True).fill(TENANT)
    page.get_by_role("button", name="Create tenant").click()
    page.get_by_role("heading", name=f"Tenant {TENANT}").wait_for()
    tenant = admin.server.api("GET", f"/tenants/{TENANT}").json()
    assert tenant["status"] == "active"
    admin.server.state["tenant_id"] = tenant["id"]
    admin.go("/tenants")
    page.get_by_label("Search by name").fill("acm")
    page.locator("#tenant-list a", has_text=TENANT).wait_for()
    # The same name again: the API's sentence, not "conflicts with what exists: conflict".
    name = page.get_by_label("Name", exact=True)
    name.fill(TENANT)
    page.get_by_role("button", name="Create tenant").click()
    error = page.locator(f"#{name.get_attribute('aria-describedby')}")
    expect(error).to_have_text(f"A tenant named '{TENANT}' already exists.")
    admin.shot("02-tenant-created")
    admin.assert_no_errors(allowed=("status of 409",))


def test_set_limits_and_weight(admin: Console) -> None:
    admin.go(f"/tenants/{TENANT}")
    page = admin.page
    page.get_by_label("Requests per minute").fill("120")
    page.get_by_label("Max output tokens").fill("64")
    page.get_by_label("Tokens in flight").fill("100000")
    page.get_by_role("button", name="Save limits").click()
    page.get_by_text("Limits saved.").wait_for()
    limits = admin.server.api("GET", f"/tenants/{TENANT}/limits").json()
    assert limits["rpm"] == 120 and limits["max_output_tokens"] == 64 and limits["tpm"] is None
    assert limits["max_tokens_in_flight"] == 100000
    page.get_by_label("Scheduling weight").fill("2.5")
    page.get_by_label("Cache isolation").select_option("key")
    # The race: the form re-renders once the PATCH answers, and this test used to wait
    # for the weight input to read '2.5', which it did from the fill on, before the
    # PATCH was even sent. A slow PATCH makes the race certain rather than occasional.
    page.evaluate(
        "() => { const f = window.fetch; window.fetch = (u, o) => (o && o.method === 'PATCH')"
        " ? new Promise((r) => setTimeout(r, 400)).then(() => f(u, o)) : f(u, o); }"
    )
    page.get_by_role("button", name="Save settings").click()
    page.locator("#banner", has_text="Settings saved.").wait_for()
    tenant = admin.server.api("GET", f"/tenants/{TENANT}").json()
    assert tenant["weight"] == 2.5 and tenant["isolation_level"] == "key"
    admin.shot("03-limits-set")
    admin.assert_no_errors()


def test_edit_cache_policy(admin: Console) -> None:
    admin.go(f"/tenants/{TENANT}")
    page = admin.page
    page.get_by_label("Cache floor", exact=True).fill("2")
    page.get_by_label("Cache floor unit").select_option("share")
    page.get_by_role("button", name="Save settings").click()
    error = page.locator("#tenant-settings-error")
    page.wait_for_function("() => document.querySelector('#tenant-settings-error')?.textContent")
    assert "share must be a number from 0 to 1" in error.inner_text()
    assert admin.server.api("GET", f"/tenants/{TENANT}").json()["cache_floor_share"] is None
    page.get_by_label("Cache floor", exact=True).fill("0.25")
    page.get_by_label("Retention TTL (s)").fill("30")
    page.get_by_label("Scrub freed blocks").select_option("true")
    page.get_by_role("button", name="Save settings").click()
    page.locator("#banner", has_text="Settings saved.").wait_for()
    tenant = admin.server.api("GET", f"/tenants/{TENANT}").json()
    assert tenant["cache_floor_share"] == 0.25 and tenant["cache_floor_blocks"] is None
    assert tenant["retention_ttl_s"] == 30.0 and tenant["scrub_on_free"] is True
    assert tenant["never_cache"] is False and tenant["weight"] == 2.5  # untouched fields kept
    # The KV quota: one over the engine's pool is refused with the pool's size, one
    # within it is saved and shown (each step on a freshly drawn page).
    admin.go(f"/tenants/{TENANT}")
    page.get_by_label("KV quota (blocks)").fill("1000000")
    page.get_by_role("button", name="Save settings").click()
    page.wait_for_function("() => document.querySelector('#tenant-settings-error')?.textContent")
    assert "kv_quota_blocks" in error.inner_text() and "blocks)" in error.inner_text()
    assert admin.server.api("GET", f"/tenants/{TENANT}").json()["kv_quota_blocks"] is None
    page.get_by_label("KV quota (blocks)").fill("8")
    page.get_by_role("button", name="Save settings").click()
    deadline = time.monotonic() + 10
    while admin.server.api("GET", f"/tenants/{TENANT}").json()["kv_quota_blocks"] != 8:
        assert time.monotonic() < deadline, "the console did not save the KV quota"
        time.sleep(0.05)
    admin.go(f"/tenants/{TENANT}")
    expect(page.get_by_label("KV quota (blocks)")).to_have_value("8")
    # Back to the defaults, so the flows after this one see a plain tenant.
    page.get_by_label("Cache floor", exact=True).fill("")
    page.get_by_label("KV quota (blocks)").fill("")
    page.get_by_label("Retention TTL (s)").fill("")
    page.get_by_label("Scrub freed blocks").select_option("")
    page.get_by_role("button", name="Save settings").click()
    deadline = time.monotonic() + 10
    while admin.server.api("GET", f"/tenants/{TENANT}").json()["retention_ttl_s"] is not None:
        assert time.monotonic() < deadline, "the console did not save the defaults"
        time.sleep(0.05)
    tenant = admin.server.api("GET", f"/tenants/{TENANT}").json()
    assert tenant["cache_floor_share"] is None and tenant["scrub_on_free"] is None
    assert tenant["kv_quota_blocks"] is None
    admin.shot("03b-cache-policy")
    admin.assert_no_errors(allowed=("status of 400",))


def test_create_key_and_read_secret(admin: Console) -> None:
    admin.go(f"/keys/{TENANT}")
    page = admin.page
    page.get_by_label("Key name").fill("browser-test")
    page.get_by_role("button", name="Create key").click()
    secret = page.locator("#new-key-secret").inner_text().strip()
    keys = admin.server.api("GET", f"/tenants/{TENANT}/keys").json()["items"]
    assert len(keys) == 1 and secret.startswith(keys[0]["prefix"])
    assert page.get_by_role("button", name="Copy").is_visible()
    assert page.get_by_role("table", name="Keys").get_by_text(keys[0]["prefix"]).is_visible()
    admin.server.state["key"] = secret
    admin.server.state["key_id"] = keys[0]["id"]
    admin.shot("04-key-created")
    # The secret is shown once: reloading the page does not bring it back.
    admin.go(f"/keys/{TENANT}")
    assert page.locator("#new-key-secret").count() == 0
    assert secret not in page.content()
    admin.assert_no_errors()


def test_use_the_key_with_the_openai_sdk(server: Server) -> None:
    client = _client(server, server.state["key"])
    deadline = time.monotonic() + 10
    while True:  # the gateway learns new keys within its refresh interval
        try:
            reply = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=5
            )
            break
        except openai.AuthenticationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    server.state["usage"] = reply.usage


def _wait_for_usage(server: Server) -> dict[str, int]:
    """The tenant's usage totals once the metering sink has stored the request."""
    deadline = time.monotonic() + 30
    while True:
        items = server.api(
            "GET",
            "/usage",
            params={
                "start": "2000-01-01T00:00:00Z",
                "end": "2100-01-01T00:00:00Z",
                "tenant_id": server.state["tenant_id"],
            },
        ).json()["items"]
        if items or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert items, "the request's usage record never reached the admin database"
    return {
        k: sum(int(i[k]) for i in items)
        for k in ("requests", "prompt_tokens", "completion_tokens", "cost_pico_usd")
    }


def test_request_appears_in_the_tenant_usage_chart(admin: Console) -> None:
    server = admin.server
    usage = server.state["usage"]
    totals = _wait_for_usage(server)
    assert totals["requests"] == 1
    assert totals["prompt_tokens"] == usage.prompt_tokens
    assert totals["completion_tokens"] == usage.completion_tokens
    admin.go(f"/tenants/{TENANT}")
    page = admin.page
    page.wait_for_function(
        "() => document.querySelector('#chart-tenant-tokens')?.chart !== undefined"
    )
    charted = page.evaluate(
        "document.querySelector('#chart-tenant-tokens').chart.data.datasets"
        ".flatMap(d => d.data).reduce((a, b) => a + b, 0)"
    )
    assert charted == usage.prompt_tokens + usage.completion_tokens
    labels = page.evaluate(
        "document.querySelector('#chart-tenant-tokens').chart.data.datasets.map(d => d.label)"
    )
    assert labels == ["tiny"]
    assert "%" in page.locator("#tenant-hit-rate").inner_text()
    page.wait_for_function("() => document.querySelector('#chart-tenant-cache')?.chart")
    colours = page.evaluate(COLOURS, "#chart-tenant-cache")
    assert colours.keys() >= CACHE_SPLIT
    server.state["tenant_colours"] = colours
    admin.shot("05-usage-chart")
    admin.assert_no_errors()


def test_tenant_page_shows_its_kv_cache_use(admin: Console) -> None:
    """The read-only "KV cache use" panel: one row per served model, with the tenant's
    blocks in use against its quota or the pool, as GET /tenants/{name}/kv says."""
    kv = admin.server.api("GET", f"/tenants/{TENANT}/kv").json()
    [model] = kv["models"]
    assert model["model"] == "tiny" and model["num_blocks"] > 0
    admin.go(f"/tenants/{TENANT}")
    panel = admin.page.locator("#tenant-kv")
    expect(panel.get_by_role("table", name="KV cache use")).to_contain_text("tiny")
    meter = panel.get_by_role("meter", name="KV blocks in use on tiny")
    expect(meter).to_have_attribute("aria-valuenow", str(model["blocks_in_use"]))
    quota = kv["kv_quota_blocks"]
    limit = model["num_blocks"] if quota is None else min(quota, model["num_blocks"])
    expect(meter).to_have_attribute("aria-valuemax", str(limit))
    expect(panel).to_contain_text("Preemptions suffered")
    panel.scroll_into_view_if_needed()
    admin.shot("05b-kv-cache-use")
    admin.assert_no_errors()


def test_billing_csv_download_matches_usage(admin: Console) -> None:
    server = admin.server
    totals = _wait_for_usage(server)
    admin.go("/usage")
    page = admin.page
    page.get_by_label("Tenant").select_option(label=TENANT)
    page.get_by_role("button", name="Show usage").click()
    page.get_by_role("table", name="Usage").wait_for()
    page.get_by_label("Billing period").fill(utc_month())
    with page.expect_download() as info:
        page.get_by_role("button", name="Download CSV").click()
    download = info.value
    assert download.suggested_filename == f"cloister-billing-{utc_month()}.csv"
    rows = list(csv.DictReader(io.StringIO(Path(download.path()).read_text())))
    lines = [r for r in rows if r["record"] == "line"]
    assert lines and {r["tenant_id"] for r in lines} == {server.state["tenant_id"]}
    assert {r["tenant_name"] for r in lines} == {TENANT}
    assert sum(int(r["requests"]) for r in lines) == totals["requests"]
    prompt = sum(int(r["input_tokens"]) + int(r["cached_input_tokens"]) for r in lines)
    assert prompt == totals["prompt_tokens"]
    assert sum(int(r["output_tokens"]) for r in lines) == totals["completion_tokens"]
    # `cloister serve` registered "tiny" without a price: its usage is listed apart, at $0.
    assert {r["section"] for r in lines if r["status"] == "200"} == {"unpriced"}
    (grand,) = [r for r in rows if r["record"] == "total" and r["section"] == "billable"]
    assert Decimal(grand["total_usd"]) == Decimal(totals["cost_pico_usd"]) / 10**12 == 0
    notice = page.locator("#usage-unpriced")
    assert notice.is_visible()
    n = totals["requests"]
    assert f"{n} request{'' if n == 1 else 's'} of model tiny" in notice.inner_text()
    assert "no price" in notice.inner_text()
    usage_table = page.get_by_role("table", name="Usage")
    assert usage_table.locator(".status.unpriced").first.inner_text() == "unpriced"
    # One palette: cached and uncached prompt tokens have the tenant page's colours.
    page.wait_for_function("() => document.querySelector('#chart-usage')?.chart")
    colours = page.evaluate(COLOURS, "#chart-usage")
    assert colours.keys() >= CACHE_SPLIT
    assert {k: colours[k] for k in CACHE_SPLIT} == {
        k: server.state["tenant_colours"][k] for k in CACHE_SPLIT
    }
    # ISO days as typed text: no date picker showing mm/dd/yyyy beside the ISO labels.
    assert page.locator(NO_PICKERS).count() == 0
    day_from = page.get_by_label("From (UTC day)")
    assert day_from.get_attribute("placeholder") == "yyyy-mm-dd"
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", day_from.input_value())
    kept = day_from.input_value()
    day_from.fill("11/05/2026")
    page.get_by_role("button", name="Show usage").click()
    expect(page.locator(f"#{day_from.get_attribute('aria-describedby')}")).to_contain_text(
        "yyyy-mm-dd"
    )
    day_from.fill(kept)
    admin.shot("06-usage-and-billing")
    admin.assert_no_errors()


def test_models_page_shows_the_loaded_model_its_device_dtype_and_price(admin: Console) -> None:
    admin.go("/models")
    page = admin.page
    models = page.get_by_role("table", name="Models")
    headers = [h.strip() for h in models.locator("thead th").all_inner_texts()]
    row = models.locator("tbody tr", has_text="tiny").first
    texts = [c.strip() for c in row.locator("td").all_inner_texts()]
    cells = dict(zip(headers, texts, strict=True))
    assert cells["Status"] == "loaded"
    assert cells["Device"] == "cpu · float32"  # as `serve` built it
    assert cells["USD per 1M tokens (input · cached · output)"] == "unpriced"
    # At 1280 px the whole table fits: prices and actions are not scrolled out of view.
    wrap = page.locator(".table-wrap", has=models)
    overflow = wrap.evaluate("(w) => w.scrollWidth - w.clientWidth")
    assert overflow <= 0, f"the Models table is {overflow} px wider than its card"
    action = row.get_by_role("button", name="Unload tiny")
    box = action.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280
    assert page.locator(NO_PICKERS).count() == 0
    assert page.get_by_label("Effective from (UTC)").get_attribute("placeholder") == (
        "yyyy-mm-dd hh:mm"
    )
    assert cells["Context · max output"].endswith("· context")


def test_models_page_sets_and_clears_a_models_output_cap(admin: Console) -> None:
    admin.go("/models")
    page = admin.page
    form = page.get_by_role("form", name="Model output cap")
    form.get_by_label("Model").select_option("tiny")
    cap = form.get_by_label("Max output tokens")
    cap.fill("32")
    form.get_by_role("button", name="Save output cap").click()
    page.locator("#banner", has_text="max output tokens 32").wait_for()
    assert admin.server.api("GET", "/models/tiny").json()["max_output_tokens"] == 32
    row = page.get_by_role("table", name="Models").locator("tbody tr", has_text="tiny").first
    expect(row).to_contain_text("· 32")
    form = page.get_by_role("form", name="Model output cap")
    form.get_by_label("Max output tokens").fill("")
    form.get_by_role("button", name="Save output cap").click()
    page.locator("#banner", has_text="context length").wait_for()
    assert admin.server.api("GET", "/models/tiny").json()["max_output_tokens"] is None
    admin.assert_no_errors()
    admin.shot("06b-models")
    admin.assert_no_errors()


def test_models_page_shows_each_adapters_engine_state_owner_and_traffic(
    admin: Console, server: Server
) -> None:
    folder = Path(server.env["CLOISTER_DATA_DIR"]) / "adapters" / "console-lora"
    folder.mkdir(parents=True, exist_ok=True)
    body = {"name": "console-lora", "base_model": "tiny", "rank": 4, "source_path": str(folder)}
    assert server.api("POST", "/adapters", json=body).status_code == 201
    admin.go("/models")
    page = admin.page
    adapters = page.get_by_role("table", name="Adapters")
    headers = [h.strip() for h in adapters.locator("thead th").all_inner_texts()]
    row = adapters.locator("tbody tr", has_text="console-lora").first
    cells = dict(
        zip(headers, [c.strip() for c in row.locator("td").all_inner_texts()], strict=True)
    )
    # This engine serves no adapters yet: registered in the registry, not on the engine.
    assert cells["Status"] == "registered" and cells["On the engine"] == "not loaded"
    assert (cells["Owner"], cells["Visibility"], cells["Requests"]) == ("—", "public", "0")
    expect(row.get_by_role("button", name="Retire console-lora")).to_be_visible()
    wrap = page.locator(".table-wrap", has=adapters)
    overflow = wrap.evaluate("(w) => w.scrollWidth - w.clientWidth")
    assert overflow <= 0, f"the Adapters table is {overflow} px wider than its card"
    admin.assert_no_errors()


def test_tenant_page_shows_its_batches_progress(admin: Console) -> None:
    """A batch sent with the openai SDK appears on the tenant page's "Batches" card with
    its lines done against the total, as GET /tenants/{name}/batches reports it."""
    server = admin.server
    client = _client(server, server.state["key"])
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
            }
        )
        + "\n"
        for i in range(3)
    )
    upload = client.files.create(file=("b.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    [row] = server.api("GET", f"/tenants/{TENANT}/batches").json()["items"]
    assert row["id"] == batch.id and row["completed_lines"] == 3 and row["total_lines"] == 3
    admin.go(f"/tenants/{TENANT}")
    panel = admin.page.locator("#tenant-batches")
    expect(panel.get_by_role("table", name="Batches")).to_contain_text(batch.id)
    meter = panel.get_by_role("meter", name=f"Lines done of batch {batch.id}")
    expect(meter).to_have_attribute("aria-valuenow", "3")
    expect(meter).to_have_attribute("aria-valuemax", "3")
    panel.scroll_into_view_if_needed()
    admin.shot("05c-batches")
    admin.assert_no_errors()


def test_revoke_key_then_the_next_call_fails(admin: Console) -> None:
    server = admin.server
    admin.go(f"/keys/{TENANT}")
    page = admin.page
    page.get_by_role("button", name="Revoke").first.click()
    dialog = page.locator("dialog#confirm")
    dialog.wait_for()
    admin.shot("07-revoke-confirmation")
    dialog.get_by_role("button", name="Revoke key", exact=True).click()
    page.get_by_text("is revoked").wait_for()
    page.get_by_role("table", name="Keys").get_by_text("revoked").wait_for()
    assert server.api("GET", f"/tenants/{TENANT}/keys").json()["items"][0]["revoked_at"]
    client = _client(server, server.state["key"])
    deadline = time.monotonic() + 10
    with pytest.raises(openai.AuthenticationError):
        while time.monotonic() < deadline:  # within the gateway's refresh interval
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
            time.sleep(0.3)
    admin.shot("08-key-revoked")
    admin.assert_no_errors()


def test_edit_stream_cadence(admin: Console) -> None:
    """The tenant's stream cadence: a bad value is refused with the server's message
    naming the field, a good one saved and shown, then back to "token"."""
    admin.go(f"/tenants/{TENANT}")
    page = admin.page
    cadence = page.get_by_label("Stream cadence")
    expect(cadence).to_have_value("token")
    expect(page.locator("form[aria-label='Tenant settings']")).to_contain_text("fixed:N")
    for bad in ("fixed:0", "fixed:100000", "chunky"):
        admin.go(f"/tenants/{TENANT}")
        page.get_by_label("Stream cadence").fill(bad)
        page.get_by_role("button", name="Save settings").click()
        page.wait_for_function(
            "() => document.querySelector('#tenant-settings-error')?.textContent"
        )
        assert "stream_cadence" in page.locator("#tenant-settings-error").inner_text(), bad
        assert admin.server.api("GET", f"/tenants/{TENANT}").json()["stream_cadence"] == "token"
    admin.go(f"/tenants/{TENANT}")
    page.get_by_label("Stream cadence").fill("fixed:4")
    page.get_by_role("button", name="Save settings").click()
    page.locator("#banner", has_text="Settings saved.").wait_for()
    tenant = admin.server.api("GET", f"/tenants/{TENANT}").json()
    assert tenant["stream_cadence"] == "fixed:4" and tenant["weight"] == 2.5  # others kept
    admin.go(f"/tenants/{TENANT}")
    expect(page.get_by_label("Stream cadence")).to_have_value("fixed:4")
    admin.shot("03c-stream-cadence")
    # Back to the default, so the flows after this one stream as before.
    page.get_by_label("Stream cadence").fill("token")
    page.get_by_role("button", name="Save settings").click()
    deadline = time.monotonic() + 10
    while admin.server.api("GET", f"/tenants/{TENANT}").json()["stream_cadence"] != "token":
        assert time.monotonic() < deadline, "the console did not save the cadence"
        time.sleep(0.05)
    admin.assert_no_errors(allowed=("status of 400",))


def test_tenant_admin_sees_only_its_tenant(browser: Any, server: Server) -> None:
    assert server.api("POST", "/tenants", json={"name": OTHER}).status_code == 201
    token = server.api("POST", "/tokens", json={"role": "tenant-admin", "tenant": TENANT}).json()
    c = Console(browser, server, "tenant-admin")
    try:
        c.sign_in(token["token"])
        page = c.page
        nav = page.locator("#nav").inner_text()
        assert "My tenant" in nav and "Audit log" not in nav and "Models" not in nav
        c.go(f"/tenants/{TENANT}")
        page.get_by_role("heading", name=f"Tenant {TENANT}").wait_for()
        # Read-only for limits and settings, no suspend button.
        expect(page.locator("#tenant-cache-policy")).to_contain_text("stream cadence: token")
        assert page.get_by_role("button", name="Save limits").count() == 0
        assert page.get_by_role("button", name="Suspend tenant").count() == 0
        c.shot("09-own-tenant")
        c.go("/keys")
        assert page.get_by_role("heading", name=f"Keys of {TENANT}").is_visible()
        assert page.get_by_label("Tenant", exact=True).count() == 0
        assert OTHER not in page.content()
        for path in (f"/tenants/{OTHER}", f"/keys/{OTHER}"):
            c.go(path)
            banner = page.locator("#banner")
            banner.wait_for()
            assert "Not found" in banner.inner_text()
            assert OTHER not in page.locator("main").inner_text()
        c.shot("10-other-tenant-by-url")
        # Names, not raw ids; no audit alarm the tenant-admin cannot act on.
        for path in (f"/tenants/{TENANT}", "/usage"):
            c.go(path)
            assert "ten_" not in page.locator("main").inner_text(), path
        usage_rows = page.get_by_role("table", name="Usage").locator("tbody tr")
        assert usage_rows.first.locator("td").nth(1).inner_text() == TENANT
        c.go("/audit")
        assert "Not available" in page.locator("main h1").inner_text()
        assert page.locator("#chain-status").count() == 0
        assert "Chain not verified" not in page.content()
        assert [
            t["name"] for t in server.api("GET", "/tenants", token["token"]).json()["items"]
        ] == [TENANT]
        c.assert_no_errors(allowed=("status of 404",))
    finally:
        c.close()


def test_viewer_sees_no_write_buttons(browser: Any, server: Server) -> None:
    token = server.api("POST", "/tokens", json={"role": "viewer"}).json()["token"]
    c = Console(browser, server, "viewer")
    try:
        c.sign_in(token)
        for path in ("/tenants", f"/tenants/{TENANT}", f"/keys/{TENANT}", "/models", "/usage"):
            c.go(path)
            for name in (
                "Create tenant",
                "Save limits",
                "Create key",
                "Revoke",
                "Register model",
                "Suspend tenant",
            ):
                assert c.page.get_by_role("button", name=name).count() == 0, (path, name)
        c.shot("11-viewer-models")
        c.assert_no_errors()
    finally:
        c.close()


def test_each_new_role_sees_what_it_may_use(browser: Any, server: Server) -> None:
    """An operator runs the platform (write buttons, no audit); finance lands on usage and
    sees nothing else; an auditor lands on the audit log and sees nothing else."""
    nav = "#nav a"
    for role, home, sections in (
        (
            "operator",
            "#/overview",
            ["Overview", "Tenants", "Keys", "Models & adapters", "Engines", "Usage & billing"],
        ),
        ("finance", "#/usage", ["Usage & billing"]),
        ("auditor", "#/audit", ["Audit log"]),
    ):
        token = server.api("POST", "/tokens", json={"role": role}).json()["token"]
        c = Console(browser, server, role)
        try:
            c.sign_in(token)
            c.page.wait_for_function("() => !!document.querySelector('main')?.dataset.rendered")
            assert c.page.evaluate("location.hash") == home, role
            assert c.page.locator(nav).all_inner_texts() == sections, role
            if role == "operator":
                c.go("/tenants")
                assert c.page.get_by_role("button", name="Create tenant").count() == 1
                c.go("/audit")
                assert c.page.get_by_role("heading", name="Not available").count() == 1
            c.assert_no_errors()
        finally:
            c.close()


def test_audit_page_shows_the_actions_and_a_valid_chain(admin: Console) -> None:
    admin.go("/audit")
    page = admin.page
    status = page.locator("#chain-status")
    status.wait_for()
    assert "Chain verified" in status.inner_text()
    assert "ok" in (status.get_attribute("class") or "")
    page.get_by_label("Tenant id").fill(admin.server.state["tenant_id"])
    page.get_by_role("button", name="Filter").click()
    page.get_by_text("key.revoke").first.wait_for()
    actions = page.get_by_role("table", name="Audit records").inner_text()
    for action in ("tenant.settings", "limits.set", "key.create", "key.revoke", "billing.export"):
        assert action in actions, action
    assert "denied:404" in actions  # the tenant-admin's tries at another tenant's pages
    page.get_by_label("Tenant id").fill("")
    page.get_by_label("Action").fill("tenant.create")
    page.get_by_role("button", name="Filter").click()
    # The table is redrawn once the filtered page arrives: until then it still lists
    # the tenant's other actions (several rows on tenants/<name>).
    records = page.get_by_role("table", name="Audit records")
    expect(records).not_to_contain_text("key.revoke")
    # The create, and the refused second create of the same name.
    expect(records.get_by_role("cell", name=f"tenants/{TENANT}", exact=True)).to_have_count(2)
    expect(records.get_by_role("cell", name="error", exact=True)).to_have_count(1)
    with page.expect_download() as info:
        page.get_by_role("button", name="Export (signed JSON lines)").click()
    exported = Path(info.value.path()).read_text()
    assert '"type": "manifest"' in exported.splitlines()[0]
    # What an auditor downloads verifies offline, with the server's public key.
    key = public_hex(load_private_key(SIGNING_KEY))
    verdict = verify_export(exported, public_key=key)
    assert verdict.ok, verdict.message
    admin.shot("13-audit")
    admin.assert_no_errors()


def test_overview_tiles_range_and_tenant_spend(admin: Console, browser: Any) -> None:
    dashboards.overview_and_tenant_spend(admin, browser)


def test_admin_tokens_page(admin: Console, browser: Any) -> None:
    dashboards.admin_tokens(admin, browser)


PAGES = (
    ("overview", "/overview"),
    ("tenants", "/tenants"),
    ("tenant", f"/tenants/{TENANT}"),
    ("keys", f"/keys/{TENANT}"),
    ("models", "/models"),
    ("engines", "/engines"),
    ("usage", "/usage"),
    ("audit", "/audit"),
    ("tokens", "/tokens"),
)
TENANT_ADMIN_PAGES = (
    ("overview", "/overview"),
    ("tenant", f"/tenants/{TENANT}"),
    ("keys", "/keys"),
    ("usage", "/usage"),
)
WIDTHS = ((1280, 800), (390, 844))  # a laptop, a phone


@pytest.mark.slow  # 26 full-page screenshots: about 8 s
def test_every_page_fits_laptop_and_phone_widths(
    admin: Console, browser: Any, server: Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Screenshots of every page with the flows' data, as an admin and as a tenant-admin,
    and no page-wide sideways scroll at either width."""
    out = screenshot_dir(tmp_path_factory)
    token = server.api("POST", "/tokens", json={"role": "tenant-admin", "tenant": TENANT}).json()
    guest = Console(browser, server, "guest")
    tenant_admin = Console(browser, server, "tenant-admin-shots")
    tenant_admin.sign_in(token["token"])
    views = [(admin, "admin", PAGES), (tenant_admin, "tenant-admin", TENANT_ADMIN_PAGES)]
    try:
        for width, height in WIDTHS:
            for c in (admin, guest, tenant_admin):
                c.page.set_viewport_size({"width": width, "height": height})
            guest.page.goto(server.base_url + "/admin")
            guest.page.get_by_label("Admin token").wait_for()
            guest.page.screenshot(path=str(out / f"{width}-sign-in.png"), full_page=True)
            for c, who, pages in views:
                for label, path in pages:
                    c.go(path)
                    c.page.wait_for_load_state("networkidle")
                    scroll = c.page.evaluate("document.documentElement.scrollWidth")
                    assert scroll <= width, (who, path, width, scroll)
                    shot = out / f"{width}-{who}-{label}.png"
                    c.page.screenshot(path=str(shot), full_page=True)
        shots = sorted(p.name for p in out.glob("*.png"))
        assert len(shots) == len(WIDTHS) * (len(PAGES) + len(TENANT_ADMIN_PAGES) + 1), shots
        guest.assert_no_errors()
        tenant_admin.assert_no_errors()
    finally:
        admin.page.set_viewport_size({"width": 1280, "height": 800})
        guest.close()
        tenant_admin.close()
    admin.assert_no_errors()
