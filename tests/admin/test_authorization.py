"""The authorization matrix: every admin endpoint x every role, and tenant-admin A against B."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI

from admin import registry
from admin.identity import create_admin_token
from admin.models import AuditEvent
from admin.roles import ROLES
from tenancy import store
from tests.admin.stand_in_models import register_stand_in
from tests.utils.admin_env import PEPPER, AdminEnv

OK = {200, 201}
DENY = {403}
HIDDEN = {404}
_counter = itertools.count()


def _n() -> str:
    return f"x{next(_counter)}"


GLOBAL_ROLES = {"a": "admin", "o": "operator", "v": "viewer", "f": "finance", "u": "auditor"}


@dataclass(frozen=True)
class Cell:
    """One endpoint: how to call it against a tenant, and the expected status per role.

    `allowed` names the platform-wide roles that succeed (a=admin, o=operator,
    v=viewer, f=finance, u=auditor, with a status in `ok`); the others get 403.
    """

    method: str
    template: str
    call: Callable[[dict[str, Any], str], tuple[str, dict[str, Any]]]
    allowed: str
    own: set[int]  # tenant-admin of alpha, on alpha (or a global resource)
    other: set[int] | None = None  # tenant-admin of alpha, on beta's resource
    ok: set[int] = field(default_factory=lambda: OK)

    def expected(self, role: str) -> set[int]:
        """The statuses `role` may get."""
        if role == "tenant-admin":
            return self.own
        letter = next(k for k, v in GLOBAL_ROLES.items() if v == role)
        return self.ok if letter in self.allowed else DENY


def _cells() -> list[Cell]:
    P = "/admin/api/v1"
    return [
        Cell("GET", "/whoami", lambda f, t: (f"{P}/whoami", {}), "aovfu", OK),
        Cell("GET", "/tenants", lambda f, t: (f"{P}/tenants?limit=10", {}), "aovf", OK),
        Cell(
            "POST", "/tenants", lambda f, t: (f"{P}/tenants", {"json": {"name": _n()}}), "ao", DENY
        ),
        Cell("GET", "/tenants/{name}", lambda f, t: (f"{P}/tenants/{t}", {}), "aov", OK, HIDDEN),
        Cell(
            "GET", "/tenants/{name}/kv", lambda f, t: (f"{P}/tenants/{t}/kv", {}), "aov", OK, HIDDEN
        ),
        Cell(
            "GET",
            "/tenants/{name}/batches",
            lambda f, t: (f"{P}/tenants/{t}/batches", {}),
            "aov",
            OK,
            HIDDEN,
        ),
        Cell(
            "GET",
            "/tenants/{name}/spend",
            lambda f, t: (f"{P}/tenants/{t}/spend", {}),
            "aovf",
            OK,
            HIDDEN,
        ),
        Cell(
            "PATCH",
            "/tenants/{name}",
            lambda f, t: (f"{P}/tenants/{t}", {"json": {"status": "active"}}),
            "ao",
            DENY,
            DENY,
        ),
        Cell(
            "PATCH",
            "/tenants/{name}/settings",
            lambda f, t: (f"{P}/tenants/{t}/settings", {"json": {"weight": 2}}),
            "ao",
            DENY,
            DENY,
        ),
        Cell(
            "GET",
            "/tenants/{name}/limits",
            lambda f, t: (f"{P}/tenants/{t}/limits", {}),
            "aov",
            OK,
            HIDDEN,
        ),
        Cell(
            "PUT",
            "/tenants/{name}/limits",
            lambda f, t: (f"{P}/tenants/{t}/limits", {"json": {"rpm": 5}}),
            "ao",
            DENY,
            DENY,
        ),
        Cell(
            "GET",
            "/tenants/{name}/keys",
            lambda f, t: (f"{P}/tenants/{t}/keys", {}),
            "aov",
            OK,
            HIDDEN,
        ),
        Cell(
            "POST",
            "/tenants/{name}/keys",
            lambda f, t: (f"{P}/tenants/{t}/keys", {"json": {}}),
            "ao",
            OK,
            HIDDEN,
        ),
        Cell(
            "POST",
            "/tenants/{name}/keys/{key_id}/revoke",
            lambda f, t: (f"{P}/tenants/{t}/keys/{f['new_key'](t)}/revoke", {}),
            "ao",
            OK,
            HIDDEN,
        ),
        Cell("GET", "/models", lambda f, t: (f"{P}/models", {}), "aov", DENY),
        Cell(
            "POST",
            "/models",
            lambda f, t: (
                f"{P}/models",
                {
                    "json": {
                        "name": _n(),
                        "source": f["model_file"],
                        "format": "gguf",
                        "context_length": 8,
                    }
                },
            ),
            "ao",
            DENY,
        ),
        Cell("GET", "/models/{name}", lambda f, t: (f"{P}/models/base", {}), "aov", DENY),
        Cell(
            "PATCH",
            "/models/{name}",
            lambda f, t: (f"{P}/models/base", {"json": {"status": "loaded"}}),
            "ao",
            DENY,
        ),
        Cell(
            "POST",
            "/models/{name}/prices",
            lambda f, t: (
                f"{P}/models/base/prices",
                {"json": {"input_price": 1, "cached_input_price": 1, "output_price": 2}},
            ),
            "ao",
            DENY,
        ),
        Cell("GET", "/adapters", lambda f, t: (f"{P}/adapters", {}), "aov", DENY),
        Cell("GET", "/adapters/runtime", lambda f, t: (f"{P}/adapters/runtime", {}), "aov", DENY),
        Cell(
            "POST",
            "/adapters",
            lambda f, t: (
                f"{P}/adapters",
                {
                    "json": {
                        "name": _n(),
                        "base_model": "base",
                        "rank": 4,
                        "source_path": f["adapter_dir"],
                    }
                },
            ),
            "ao",
            DENY,
        ),
        Cell(
            "POST",
            "/adapters/upload",
            lambda f, t: (
                f"{P}/adapters/upload?name={_n()}&base_model=base",
                {"content": b"not a zip"},
            ),
            "ao",
            DENY,
            ok={400},
        ),
        Cell(
            "PATCH",
            "/adapters/{name}",
            lambda f, t: (f"{P}/adapters/ad1", {"json": {"status": "loaded"}}),
            "ao",
            DENY,
        ),
        Cell("GET", "/prefixes", lambda f, t: (f"{P}/prefixes", {}), "aov", DENY),
        Cell(
            "POST",
            "/prefixes",
            lambda f, t: (
                f"{P}/prefixes",
                {"json": {"name": _n(), "model": "base", "token_ids": [1, 2]}},
            ),
            "ao",
            DENY,
        ),
        Cell(
            "DELETE",
            "/prefixes/{name}",
            lambda f, t: (f"{P}/prefixes/{f['new_prefix']()}", {}),
            "ao",
            DENY,
        ),
        Cell(
            "GET",
            "/usage",
            lambda f, t: (
                f"{P}/usage?start=2026-01-01T00:00:00Z&end=2027-01-01T00:00:00Z&tenant_id={f['ids'][t]}",
                {},
            ),
            "aovf",
            OK,
            HIDDEN,
        ),
        Cell(
            "GET",
            "/usage/requests",
            lambda f, t: (f"{P}/usage/requests?client_request_id=r1&tenant_id={f['ids'][t]}", {}),
            "aovf",
            OK,
            HIDDEN,
        ),
        Cell(
            "GET",
            "/billing/export",
            lambda f, t: (f"{P}/billing/export?period=2026-11&tenant_id={f['ids'][t]}", {}),
            "avf",
            OK,
            HIDDEN,
        ),
        Cell("GET", "/audit", lambda f, t: (f"{P}/audit", {}), "avu", DENY),
        Cell(
            "GET", "/audit/search", lambda f, t: (f"{P}/audit/search?action=key", {}), "avu", DENY
        ),
        Cell("GET", "/audit/export", lambda f, t: (f"{P}/audit/export", {}), "avu", DENY),
        Cell("GET", "/audit/verify", lambda f, t: (f"{P}/audit/verify", {}), "avu", DENY),
        Cell("GET", "/tokens", lambda f, t: (f"{P}/tokens", {}), "av", DENY),
        Cell(
            "POST", "/tokens", lambda f, t: (f"{P}/tokens", {"json": {"role": "viewer"}}), "a", DENY
        ),
        Cell(
            "POST",
            "/tokens/{token_id}/revoke",
            lambda f, t: (f"{P}/tokens/{f['new_token']()}/revoke", {}),
            "a",
            DENY,
        ),
        Cell("GET", "/overview", lambda f, t: (f"{P}/overview", {}), "aov", OK),
        Cell("GET", "/engines", lambda f, t: (f"{P}/engines", {}), "aov", DENY),
    ]


# The OIDC flow itself, and the console's sign-in options (no secrets).
PUBLIC = {("GET", "/auth/login"), ("GET", "/auth/callback"), ("GET", "/console/config")}


def _routes(env: AdminEnv) -> set[tuple[str, str]]:
    """Every (method, path) the admin router serves, from an app's OpenAPI document."""
    from admin.router import create_admin_router

    app = FastAPI()
    app.include_router(create_admin_router(env.services))
    return {
        (method.upper(), path.removeprefix("/admin/api/v1"))
        for path, ops in app.openapi()["paths"].items()
        for method in ops
    }


def _fixtures(env: AdminEnv) -> dict[str, Any]:
    with env.sessions() as s:
        register_stand_in(s, "base")
        registry.register_adapter(s, name="ad1", base_model="base", rank=4, source_path="/a")
        ids = {t.name: t.id for t in store.list_tenants(s)}

    def new_key(tenant: str) -> str:
        with env.sessions() as s:
            return store.create_key(s, tenant_name=tenant, pepper=PEPPER).id

    def new_token() -> str:
        with env.sessions() as s:
            return create_admin_token(s, pepper=PEPPER, role="viewer").id

    def new_prefix() -> str:
        name = _n()
        with env.sessions() as s:
            registry.publish_prefix(s, name=name, model="base", token_ids=[1, 2])
        return name

    model_file = env.tmp / "models" / "m.gguf"
    model_file.write_bytes(b"GGUF")
    adapter_dir = env.tmp / "models" / "adapter"
    adapter_dir.mkdir(exist_ok=True)
    (adapter_dir / "adapter_config.json").write_text("{}")
    return {
        "ids": ids,
        "new_key": new_key,
        "new_token": new_token,
        "new_prefix": new_prefix,
        "model_file": str(model_file),
        "adapter_dir": str(adapter_dir),
    }


def test_matrix_covers_every_route(env: AdminEnv) -> None:
    covered = {(c.method, c.template) for c in _cells()}
    assert covered | PUBLIC == _routes(env)


def test_no_endpoint_without_authentication(env: AdminEnv) -> None:
    fx = _fixtures(env)
    for cell in _cells():
        path, kwargs = cell.call(fx, "alpha")
        for headers in (
            {},
            {"Authorization": "Bearer clo-adm-forged"},
            {"Authorization": "Bearer ses.e30.bad"},
        ):
            r = env.client.request(cell.method, path, headers=headers, **kwargs)
            assert r.status_code == 401, (cell.method, path, headers, r.status_code)


def test_every_endpoint_times_every_role(env: AdminEnv) -> None:
    fx = _fixtures(env)
    roles = {role: env.token(role) for role in GLOBAL_ROLES.values()}
    roles["tenant-admin"] = env.token("tenant-admin", "alpha")
    assert set(roles) == set(ROLES)  # a role added without a column here fails
    failures = []
    for cell in _cells():
        for role, headers in roles.items():
            path, kwargs = cell.call(fx, "alpha")
            got = env.client.request(cell.method, path, headers=headers, **kwargs).status_code
            if got not in cell.expected(role):
                failures.append((cell.method, cell.template, role, got))
        if cell.other is not None:
            path, kwargs = cell.call(fx, "beta")
            headers = roles["tenant-admin"]
            got = env.client.request(cell.method, path, headers=headers, **kwargs).status_code
            if got not in cell.other:
                failures.append((cell.method, cell.template, "tenant-admin(alpha) on beta", got))
    assert failures == []


def test_tenant_admin_lists_only_its_tenant_and_denials_are_audited(env: AdminEnv) -> None:
    headers = env.token("tenant-admin", "alpha")
    names = [
        t["name"] for t in env.client.get("/admin/api/v1/tenants", headers=headers).json()["items"]
    ]
    assert names == ["alpha"]
    assert env.client.get("/admin/api/v1/tokens", headers=headers).status_code == 403
    assert env.client.get("/admin/api/v1/tenants").status_code == 401
    env.services.audit_writer.flush()
    with env.sessions() as s:
        outcomes = sorted(e.outcome for e in s.query(AuditEvent) if e.outcome.startswith("denied"))
    assert outcomes == ["denied:401", "denied:403"]


def test_secrets_never_reach_the_audit_log(env: AdminEnv) -> None:
    headers = env.token("admin")
    secret = env.client.post("/admin/api/v1/tenants/alpha/keys", json={}, headers=headers).json()[
        "secret"
    ]
    token = env.client.post(
        "/admin/api/v1/tokens", json={"role": "viewer"}, headers=headers
    ).json()["token"]
    export = env.client.get("/admin/api/v1/audit/export", headers=headers).text
    assert secret not in export and token not in export
    assert "key.create" in export and "token.create" in export
    keys = env.client.get("/admin/api/v1/tenants/alpha/keys", headers=headers).json()["items"]
    assert all("secret" not in k and "secret_hash" not in k for k in keys)


def test_tenant_metrics_are_for_platform_wide_roles_only(env: AdminEnv) -> None:
    """The gateway's /metrics check: admin, operator and viewer see tenant series."""
    from admin.deps import operator_auth

    check = operator_auth(env.services)
    seen = {
        role: check(env.token(role, "alpha" if role == "tenant-admin" else None)["Authorization"])
        for role in ROLES
    }
    assert seen == {
        "admin": True,
        "operator": True,
        "viewer": True,
        "finance": False,
        "auditor": False,
        "tenant-admin": False,
    }
