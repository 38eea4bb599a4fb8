"""The Engines page, published prefixes on the Models page, and OIDC sign-in in the
browser: one `cloister serve` (tiny model) whose admin console signs in through a real
OpenID provider on loopback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.admin.engine_stand_ins import SPECULATIVE_FIGURES
from tests.admin.oidc_provider import Provider, start_provider
from tests.utils.admin_console import Console, Server, serve_console
from tests.utils.services import free_port

CLIENT_ID = "cloister-console"
SPECULATIVE = "Speculative decoding"
# A host-memory KV tier (L2) under the engine's pool, so the Engines page has a real one.
HOST_TIER_BYTES = 1024 * 1024


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    """The OpenID provider (it approves every authorization request at once)."""
    p, stop = start_provider(CLIENT_ID)
    yield p
    stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, provider: Provider) -> Iterator[Server]:
    """`cloister serve` with OIDC sign-in through `provider`, back to /admin/oidc."""
    port = free_port()
    oidc = {
        "CLOISTER_ADMIN_OIDC_ISSUER": provider.issuer,
        "CLOISTER_ADMIN_OIDC_CLIENT_ID": CLIENT_ID,
        "CLOISTER_ADMIN_OIDC_REDIRECT_URI": f"http://127.0.0.1:{port}/admin/oidc",
        "CLOISTER_KV_HOST_BYTES": str(HOST_TIER_BYTES),
    }
    yield from serve_console(tmp_path_factory, port, oidc)


@pytest.fixture(scope="module")
def admin(browser: Any, server: Server) -> Iterator[Console]:
    """The admin's browser context, signed in with a token."""
    console = Console(browser, server, "engines")
    console.sign_in(server.admin_token)
    yield console
    console.close()


def _cells(table: Any, row_text: str) -> dict[str, str]:
    headers = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    row = table.locator("tbody tr", has_text=row_text).first
    return dict(zip(headers, [c.strip() for c in row.locator("td").all_inner_texts()], strict=True))


def test_engines_api_reports_the_tiny_model_engine(server: Server) -> None:
    """GET /engines on the live server: the in-process engine of `tiny`, its pool, load and,
    after the same prompt twice, a prefix-cache hit rate of hits over looked-up tokens."""
    assert server.api("POST", "/tenants", json={"name": "acme"}).status_code == 201
    key = server.api("POST", "/tenants/acme/keys", json={}).json()["secret"]
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    for _ in range(2):
        r = httpx.post(
            f"{server.base_url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"model": "tiny", "prompt": prompt, "max_tokens": 1},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    body = server.api("GET", "/engines").json()
    assert body["connected"] is True
    [model] = body["models"]
    assert model["model"] == "tiny"
    [replica] = model["replicas"]
    assert replica["replica"] == "in-process" and replica["alive"] is True
    assert (replica["device"], replica["dtype"]) == ("cpu", "float32")
    assert replica["num_blocks"] > 0 and replica["block_size"] > 0
    assert replica["kv_capacity_tokens"] == replica["num_blocks"] * replica["block_size"]
    assert (replica["num_running"], replica["num_waiting"]) == (0, 0)
    queries, hits = replica["prefix_cache_queries"], replica["prefix_cache_hits"]
    assert 0 < hits < queries  # the second prompt reused the first one's full blocks
    assert replica["prefix_hit_rate"] == pytest.approx(hits / queries)
    server.state["engine"] = replica


def test_engines_page_shows_the_model_capacity_and_load(admin: Console, server: Server) -> None:
    """The nav has Engines; its table shows the tiny model's replica as the API does."""
    admin.page.get_by_role("link", name="Engines").click()
    admin.page.wait_for_function(
        "() => document.querySelector('main')?.dataset.rendered === '/engines'"
    )
    r = server.state["engine"]
    table = admin.page.get_by_role("table", name="Engines of tiny")
    cells = _cells(table, "in-process")
    capacity = f"{r['num_blocks']:,} × {r['block_size']:,} = {r['kv_capacity_tokens']:,} tokens"
    assert cells["KV capacity (blocks × size)"] == capacity
    assert cells["State"] == "serving"
    assert cells["Device · dtype"] == "cpu · float32"
    assert (cells["Running"], cells["Waiting"]) == ("0", "0")
    assert cells["KV used"].endswith("%")
    assert cells["Prefix-cache hits"] == f"{r['prefix_hit_rate'] * 100:.1f} %"
    assert r["speculative"] is None and cells[SPECULATIVE] == "off"
    admin.shot("engines")
    admin.assert_no_errors()


@contextlib.contextmanager
def _engines_answer(page: Any, models: dict[str, list[dict[str, Any]]]) -> Iterator[None]:
    """Within the block, the page's GET /engines is answered with made-up figures: a
    connected gateway serving `models` (model -> its replicas' rows), in that order."""
    body = {
        "connected": True,
        "models": [{"model": name, "replicas": rows} for name, rows in models.items()],
    }
    page.route(
        "**/admin/api/v1/engines",
        lambda route: route.fulfill(
            status=200, content_type="application/json", body=json.dumps(body)
        ),
    )
    try:
        yield
    finally:
        page.unroute("**/admin/api/v1/engines")


def test_engines_page_shows_the_speculative_acceptance(admin: Console, server: Server) -> None:
    """A speculating engine's row shows its acceptance rate and mean accepted length, one
    that has not drafted yet says so; the page is the real one, the API answer made up
    (this server's tiny engine does not speculate)."""
    spec = SPECULATIVE_FIGURES
    fresh = {**spec, "num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    fresh.update(accepted_per_pos=[0, 0, 0, 0], acceptance_rate=None, mean_accepted_length=None)
    base = server.state["engine"]
    models = {"tiny": [{**base, "speculative": spec}], "fresh": [{**base, "speculative": fresh}]}
    page = admin.page
    with _engines_answer(page, models):
        admin.go("/engines")
        cells = _cells(page.get_by_role("table", name="Engines of tiny"), "in-process")
        assert cells[SPECULATIVE] == "62.5 % · 3.50 tok/step"
        cells = _cells(page.get_by_role("table", name="Engines of fresh"), "in-process")
        assert cells[SPECULATIVE] == "on, no draft yet"
        admin.shot("engines-speculative")
        admin.assert_no_errors()


TIER_COLUMNS = [
    "Replica", "Tier", "Blocks (held / capacity)", "Bytes (held / capacity)",
    "Hit rate (lookups)", "Loads", "Write-backs", "Recomputed instead",
]  # fmt: skip


def test_engines_page_shows_the_real_host_tier(admin: Console, server: Server) -> None:
    """The live engine's host tier (L2): GET /engines reports it with the capacity its
    budget holds, and the page's tier table shows the same figures."""
    [model] = server.api("GET", "/engines").json()["models"]
    [replica] = model["replicas"]
    [host] = replica["kv_tiers"]
    assert host["medium"] == "CPU_HOST"
    assert 0 < host["capacity_bytes"] <= HOST_TIER_BYTES
    per_block = host["capacity_bytes"] // host["capacity_blocks"]
    assert host["capacity_blocks"] == HOST_TIER_BYTES // per_block
    admin.go("/engines")
    table = admin.page.get_by_role("table", name="KV tiers of tiny")
    headers = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    assert headers == TIER_COLUMNS
    cells = _cells(table, "in-process")
    assert cells["Tier"] == "L2 host memory (CPU_HOST)"
    capacity = f"{host['blocks']:,} / {host['capacity_blocks']:,}"
    assert cells["Blocks (held / capacity)"] == capacity
    assert cells["Bytes (held / capacity)"].endswith(" / 1.0 MiB")
    assert (cells["Loads"], cells["Write-backs"]) == (str(host["loads"]), str(host["write_backs"]))
    admin.shot("engines-tiers")
    admin.assert_no_errors()


def test_engines_page_shows_each_tiers_figures(admin: Console, server: Server) -> None:
    """Host memory and disk tiers with made-up figures (the page is the real one): held
    and capacity in blocks and bytes, the hit rate over the lookups that went on into the
    tier (a dash before the first), loads, write-backs and blocks recomputed instead; a
    model whose engine has no tier shows no tier table."""
    host = {
        "medium": "CPU_HOST", "blocks": 10, "capacity_blocks": 100, "bytes": 40960,
        "capacity_bytes": 409600, "lookups": 8, "hits": 6, "hit_rate": 0.75, "hit_blocks": 12,
        "loads": 9, "write_backs": 2000, "recomputed_instead": 3, "evictions": 1,
        "expirations": 0,
    }  # fmt: skip
    disk = {
        **host, "medium": "DISK", "blocks": 1, "capacity_blocks": 3000,
        "bytes": 4096 * 1, "capacity_bytes": 3 * 1024**3, "lookups": 0, "hits": 0,
        "hit_rate": None, "loads": 0, "write_backs": 5, "recomputed_instead": 0,
    }  # fmt: skip
    base = {k: v for k, v in server.state["engine"].items() if k != "kv_tiers"}
    page = admin.page
    with _engines_answer(page, {"tiny": [{**base, "kv_tiers": [host, disk]}], "plain": [base]}):
        admin.go("/engines")
        table = page.get_by_role("table", name="KV tiers of tiny")
        rows = table.locator("tbody tr")
        assert rows.count() == 2
        cells = _cells(table, "L2 host memory (CPU_HOST)")
        assert cells == {
            "Replica": "in-process",
            "Tier": "L2 host memory (CPU_HOST)",
            "Blocks (held / capacity)": "10 / 100",
            "Bytes (held / capacity)": "40.0 KiB / 400.0 KiB",
            "Hit rate (lookups)": "75.0 % (6 of 8)",
            "Loads": "9",
            "Write-backs": "2,000",
            "Recomputed instead": "3",
        }
        cells = _cells(table, "L3 disk (DISK)")
        assert cells["Blocks (held / capacity)"] == "1 / 3,000"
        assert cells["Bytes (held / capacity)"] == "4.0 KiB / 3.0 GiB"
        assert cells["Hit rate (lookups)"] == "—"
        assert page.get_by_role("table", name="Engines of plain").is_visible()
        assert page.get_by_role("table", name="KV tiers of plain").count() == 0
        admin.shot("engines-tiers-figures")
        admin.assert_no_errors()


def test_published_prefix_is_listed_and_withdraw_removes_it(admin: Console, server: Server) -> None:
    """A prefix published through the API is in the table with its length; the
    operator's Withdraw (confirmed) deletes it from the registry and the table."""
    made = server.api(
        "POST",
        "/prefixes",
        json={"name": "system-v1", "model": "tiny", "token_ids": list(range(1, 33))},
    )
    assert made.status_code == 201, made.text
    admin.go("/models")
    page = admin.page
    table = page.get_by_role("table", name="Published prefixes")
    cells = _cells(table, "system-v1")
    assert (cells["Model"], cells["Length"]) == ("tiny", "32 tokens")
    assert cells["Created"].endswith(" UTC")
    # No invented per-prefix hit counts: the page says where hits are counted instead.
    assert (
        "Hits are not counted per prefix"
        in page.get_by_role("region", name="Published prefixes").inner_text()
    )
    assert (
        page.locator("#public-blocks")
        .inner_text()
        .startswith("Published-prefix blocks in the KV cache now — tiny: ")
    )
    admin.shot("models-prefixes")
    page.get_by_role("button", name="Withdraw system-v1").click()
    page.locator("#confirm-ok").click()
    page.get_by_text("Prefix system-v1 is withdrawn.").wait_for()
    page.get_by_text("No prefix is published.").wait_for()
    assert server.api("GET", "/prefixes").json()["items"] == []
    admin.assert_no_errors()


def test_oidc_sign_in_and_sign_out_in_the_browser(
    browser: Any, server: Server, provider: Provider
) -> None:
    """Sign in with your organisation: the provider's redirect lands back in the console
    signed in as the OIDC identity and role; signing out forgets the session."""
    provider.claims = {"email": "ops@example.com", "cloister_role": "operator"}
    c = Console(browser, server, "oidc")
    try:
        page = c.page
        page.goto(server.base_url + "/admin")
        link = page.get_by_role("link", name="Sign in with your organisation (OIDC)")
        with page.expect_request(lambda r: r.url.startswith(provider.issuer + "/authorize")):
            link.click()
        page.wait_for_function(
            "() => document.querySelector('main')?.dataset.rendered === '/overview'"
        )
        assert page.url == server.base_url + "/admin#/overview"  # the code left the address bar
        assert page.locator("#who-text").inner_text() == "oidc:ops@example.com · operator"
        assert page.get_by_role("link", name="Engines").is_visible()
        page.get_by_role("button", name="Sign out").click()
        page.get_by_text("You are signed out.").wait_for()
        assert page.evaluate("sessionStorage.getItem('cloister.admin.token')") is None
        page.reload()
        page.get_by_role("link", name="Sign in with your organisation (OIDC)").wait_for()
        assert page.locator("#who").is_hidden()
        c.assert_no_errors()
    finally:
        c.close()
