"""A live `cloister serve` on a tiny model for the admin console's browser flows, and a signed-in
headless Debian chromium context with its console and page errors collected."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.utils.services import stop_process, wait_http_ok
from tests.utils.tiny_model import make_tiny_model_dir

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PEPPER = "admin-ui-test-pepper"
SIGNING_KEY = "7c" * 32
OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "admin_ui"
START_TIMEOUT_S = 120.0


@dataclass
class Server:
    """The running `cloister serve` and what the flows learn along the way."""

    base_url: str
    env: dict[str, str]
    proc: subprocess.Popen[bytes]
    log_path: Path
    admin_token: str
    state: dict[str, Any] = field(default_factory=dict)

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        """Calls the admin API as `token` (default: the admin)."""
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.request(
            method, f"{self.base_url}/admin/api/v1{path}", headers=headers, timeout=30, **kw
        )

    def cli(self, *args: str) -> str:
        """Runs a `cloister` command against the same data dir; returns its stdout."""
        out = subprocess.run(
            [sys.executable, "-c", "from cloister.cli import main; main()", *args],
            env=self.env,
            capture_output=True,
            check=True,
            timeout=120,
        )
        return out.stdout.decode()


def _require_chromium() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CLOISTER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{CHROMIUM} is required (CLOISTER_REQUIRE_SERVICES=1)")
        pytest.skip(reason=f"{CHROMIUM} is not installed (apt-get install chromium)")


def serve_console(
    tmp_path_factory: pytest.TempPathFactory, port: int, extra_env: dict[str, str] | None = None
) -> Iterator[Server]:
    """Runs `cloister serve` on `port` with the console's test settings (and `extra_env`)
    until the generator is closed; yields it once it answers, with an admin token."""
    _require_chromium()
    root = tmp_path_factory.mktemp("console")
    model = make_tiny_model_dir(root / "model")
    env = dict(os.environ)
    env.update(
        {
            "CLOISTER_DATA_DIR": str(root / "data"),
            "CLOISTER_KEY_PEPPER": PEPPER,
            "CLOISTER_MODEL": str(model),
            "CLOISTER_MODEL_NAME": "tiny",
            "CLOISTER_PORT": str(port),
            "CLOISTER_ATTENTION_BACKEND": "torch",
            "CLOISTER_MAX_MODEL_LEN": "512",
            "CLOISTER_KV_CACHE_BYTES": str(8 * 1024 * 1024),
            "CLOISTER_CONFIG_REFRESH_S": "0.5",
            "CLOISTER_ADMIN_AUDIT_SIGNING_KEY": SIGNING_KEY,
            "CLOISTER_ADMIN_AUDIT_CHECKPOINT_EVERY": "5",
            **(extra_env or {}),
        }
    )
    log_path = root / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from cloister.cli import main; main()", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(proc, base + "/health", log_path, START_TIMEOUT_S, "cloister serve")
        srv = Server(base, env, proc, log_path, admin_token="")
        srv.admin_token = json.loads(srv.cli("admin", "create-token", "--role", "admin", "--json"))[
            "token"
        ]
        yield srv
    finally:
        stop_process(proc)
        OUTPUT.mkdir(parents=True, exist_ok=True)
        shutil.copy(log_path, OUTPUT / "serve.log")


class Console:
    """One browser context signed in (or not) with console and page errors collected."""

    def __init__(self, browser: Any, server: Server, name: str) -> None:
        self.server = server
        # en-US: the locale whose date picker shows mm/dd/yyyy (the console must not use one).
        self.context = browser.new_context(viewport={"width": 1280, "height": 800}, locale="en-US")
        self.page = self.context.new_page()
        self.page.set_default_timeout(15_000)
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.name = name

    def sign_in(self, token: str) -> None:
        """Signs in with an admin token, from the keyboard."""
        page = self.page
        page.goto(self.server.base_url + "/admin")
        page.get_by_label("Admin token").focus()
        page.keyboard.type(token)
        page.keyboard.press("Enter")
        page.wait_for_selector("#nav a")

    def go(self, hash_path: str) -> None:
        """Opens a console view and waits for it to render."""
        url = f"{self.server.base_url}/admin#{hash_path}"
        if self.page.url == url:  # a same-hash goto is no navigation at all
            self.page.reload()
        else:
            self.page.goto(url)
        # The shell marks <main> with the path once that path's page is drawn: waiting
        # for a spinner to go can pass before the hash change has even been handled.
        self.page.wait_for_function(
            "(path) => document.querySelector('main')?.dataset.rendered === path", arg=hash_path
        )

    def shot(self, label: str) -> Path:
        """Saves a full-page screenshot under test-output/admin_ui/."""
        OUTPUT.mkdir(parents=True, exist_ok=True)
        path = OUTPUT / f"{self.name}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def assert_no_errors(self, allowed: tuple[str, ...] = ()) -> None:
        """Fails on any console or page error not matching an `allowed` substring."""
        bad = [e for e in self.errors if not any(a in e for a in allowed)]
        assert not bad, f"JavaScript errors: {bad}"
        self.errors.clear()

    def close(self) -> None:
        """Closes the context."""
        self.context.close()


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the every-page screenshots go: var/screenshots/ with CLOISTER_KEEP_SCREENSHOTS=1,
    else a folder under pytest's tmp dir."""
    if os.environ.get("CLOISTER_KEEP_SCREENSHOTS") == "1":
        path = Path(__file__).resolve().parents[2] / "var" / "screenshots"
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("screenshots")


def utc_month() -> str:
    """The current billing period."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m")
