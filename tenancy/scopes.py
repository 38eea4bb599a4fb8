"""The one spelling of a tenant's scope, "t:<tenant id>", and of a key's within it.

The same string roots a tenant's cache domain (tenancy/principal.py), names its limit
counters (tenancy/limits.py), is its fairness key in the engine (the gateway's
requests) and keys its cache rules and KV figures. One module, so that no place can
spell it differently from the others.
"""

from __future__ import annotations

TENANT_PREFIX = "t:"


def tenant_scope(tenant_id: str) -> str:
    """A tenant's scope: "t:<tenant id>"."""
    return f"{TENANT_PREFIX}{tenant_id}"


def key_scope(tenant_id: str, key_id: str) -> str:
    """One API key's scope within its tenant's: "t:<tenant id>/k:<key id>"."""
    return f"{tenant_scope(tenant_id)}/k:{key_id}"


def tenant_id_of(scope: str) -> str:
    """The tenant id of a tenant scope; a string of another shape is returned as it is."""
    return scope[len(TENANT_PREFIX) :] if scope.startswith(TENANT_PREFIX) else scope
