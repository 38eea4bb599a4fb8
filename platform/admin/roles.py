"""The admin roles and what each may do: one place, read by the routes and the tests.

    role          may
    admin         everything
    operator      run the platform: tenants, keys, limits, models, adapters, prefixes
                  (read and write), usage and the overview; no admin tokens, no audit,
                  no billing export
    viewer        every read (GET) and the exports; no writes
    finance       usage and billing: read and export, and the list of tenants (whose
                  names label its usage and bills); nothing else
    auditor       the audit log: read, search, verify and export; nothing else
    tenant-admin  reads of its own tenant, its keys (create, revoke), usage and billing;
                  another tenant's resources are 404 (existence is not revealed)

Secrets are never readable by anyone; `whoami` answers every role.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["admin", "operator", "viewer", "finance", "auditor", "tenant-admin"]
ROLES: tuple[Role, ...] = ("admin", "operator", "viewer", "finance", "auditor", "tenant-admin")
# Roles that see the whole platform (a tenant-admin sees only its own tenant).
OPERATOR_ROLES: tuple[Role, ...] = ("admin", "operator", "viewer")

EVERY_ROLE: tuple[Role, ...] = ROLES
ADMIN_ONLY: tuple[Role, ...] = ("admin",)
PLATFORM_READ: tuple[Role, ...] = ("admin", "operator", "viewer")
PLATFORM_WRITE: tuple[Role, ...] = ("admin", "operator")
TENANT_READ: tuple[Role, ...] = (*PLATFORM_READ, "tenant-admin")  # scoped to its tenant
TENANT_LIST: tuple[Role, ...] = (*TENANT_READ, "finance")  # finance labels usage by name
KEY_WRITE: tuple[Role, ...] = (*PLATFORM_WRITE, "tenant-admin")
OVERVIEW_READ: tuple[Role, ...] = (*PLATFORM_READ, "tenant-admin")
USAGE_READ: tuple[Role, ...] = ("admin", "operator", "viewer", "finance", "tenant-admin")
BILLING_READ: tuple[Role, ...] = ("admin", "viewer", "finance", "tenant-admin")
AUDIT_READ: tuple[Role, ...] = ("admin", "viewer", "auditor")
TOKEN_READ: tuple[Role, ...] = ("admin", "viewer")
