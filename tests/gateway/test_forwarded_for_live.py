"""Live `cloister serve` behind a proxy: CLOISTER_FORWARDED_ALLOW_IPS decides whose
X-Forwarded-For is believed, and so which address the failed-key throttle counts and
the audit log records.

Behind an ingress every client arrives from the ingress's address. Unless that
address is trusted, the clients share one throttle window, and one tenant's bad keys
get every other tenant's first request (a key not yet cached) a 429. Trusted, each
client is counted by its own address; not trusted, a client cannot pick its address
by sending the header.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from admin.identity import create_admin_token
from tests.gateway.processes import create_tenant_key, database, gateways
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

LIMIT = 3  # bad keys per address and window before 429


def bad_key(i: int) -> str:
    """A well-formed key no tenant holds; a new one each time (a known bad key is
    answered from the gateway's cache, and counted once)."""
    return f"sk-clo-{i:04d}" + "z" * 39


def _chat(base_url: str, key: str, client: str) -> int:
    r = httpx.post(
        base_url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        headers={"Authorization": f"Bearer {key}", "X-Forwarded-For": client},
        timeout=60,
    )
    return r.status_code


def _denial_sources(base_url: str, admin: str) -> set[str]:
    r = httpx.get(
        base_url + "/admin/api/v1/audit",
        params={"limit": 500, "action": "auth.denied"},
        headers={"Authorization": f"Bearer {admin}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return {e["source_ip"] for e in r.json()["items"] if e["resource"] == "gateway"}


def test_trusted_proxies_decide_the_client_address(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sessions = database(data_dir)
    keys = [create_tenant_key(sessions, f"t{i}") for i in range(2)]
    with sessions() as s:
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
    common = {"auth_failure_limit": LIMIT}
    configs = [
        {**common, "forwarded_allow_ips": "127.0.0.1"},  # this test is the trusted proxy
        {**common, "forwarded_allow_ips": ""},  # no proxy is trusted
    ]
    model = make_tiny_model_dir(tmp_path / "model")
    with gateways(data_dir, model, tmp_path / "logs", configs) as (trusting, wary):
        # Trusted: a client's bad keys throttle that client, and no other behind the proxy.
        bad = [_chat(trusting.base_url, bad_key(i), "203.0.113.5") for i in range(LIMIT + 1)]
        assert bad == [401] * LIMIT + [429], bad
        assert _chat(trusting.base_url, keys[0], "203.0.113.6") == 200
        assert _chat(trusting.base_url, bad_key(100), "203.0.113.6") == 401

        # Not trusted: the header changes nothing, all share the socket's address. A
        # client cannot leave its throttle window by naming another address...
        bad = [_chat(wary.base_url, bad_key(i), f"198.51.100.{i}") for i in range(LIMIT + 1)]
        assert bad == [401] * LIMIT + [429], bad
        # ...and, as behind an untrusted ingress, the others' new keys wait with it.
        assert _chat(wary.base_url, keys[1], "198.51.100.77") == 429

        # The audit log records the address each gateway believed (a read of the log
        # through a gateway first writes that gateway's open denial windows).
        sources = _denial_sources(trusting.base_url, admin) | _denial_sources(wary.base_url, admin)
        assert sources == {"203.0.113.5", "203.0.113.6", "127.0.0.1"}, sources
        for gw in (trusting, wary):
            assert "Traceback" not in gw.logs()
