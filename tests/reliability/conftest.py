"""One live `cloister serve` on a tiny random-weight model for the hostile-tenant suite.

The server is shared by the suite's modules (starting one costs tens of seconds on
busy cores): tenants `bystander-a` and `bystander-b` stream greedy completions
whose expected text was taken while the server was quiet; `attacker` does the rest.
Capacity is small (8 running sequences, 8 waiting) so that 3x overload is cheap.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from admin.identity import create_admin_token
from tests.gateway.processes import (
    create_tenant_key,
    database,
    spawn_gateway,
    stop,
    wait_ready,
)
from tests.reliability.live import Bystanders
from tests.utils.hostile_server import (
    BYSTANDER_PROMPTS,
    SERVER_SETTINGS,
    LiveServer,
    quiet_bystander,
)
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """`cloister serve` with two bystanders, an attacker tenant and an admin token."""
    root = tmp_path_factory.mktemp("reliability")
    data_dir = root / "data"
    sessions = database(data_dir)
    keys = {name: create_tenant_key(sessions, name) for name in BYSTANDER_PROMPTS}
    attacker = create_tenant_key(sessions, "attacker")
    with sessions() as s:
        admin_token = create_admin_token(s, pepper=PEPPER, role="admin", name="reliability").secret
    # Untied weights: greedy text varies token to token (a tied tiny model repeats one
    # token), so a bystander's changed stream shows.
    model = make_tiny_model_dir(root, tie=False)
    gw = spawn_gateway(data_dir, model, root / "server.log", **SERVER_SETTINGS)
    try:
        wait_ready(gw)
        members = [
            quiet_bystander(gw.base_url, name, keys[name], prompt, max_tokens)
            for name, (prompt, max_tokens) in BYSTANDER_PROMPTS.items()
        ]
        yield LiveServer(
            gw, data_dir, model, admin_token, attacker, Bystanders(gw.base_url, members)
        )
    finally:
        stop(gw)
