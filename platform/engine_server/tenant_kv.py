"""Per-tenant KV use (`engine.stats.EngineStats.tenant_kv`) in the JSON of the engine
server's GET /internal/stats, and back in the gateway's remote client."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.stats import TenantKVStats


def tenant_kv_to_json(report: Mapping[str, TenantKVStats]) -> dict[str, dict[str, int]]:
    """The engine server's form of a report: key -> the three figures by name."""
    return {
        key: {
            "blocks_in_use": s.blocks_in_use,
            "preemptions_suffered": s.preemptions_suffered,
            "preemptions_caused": s.preemptions_caused,
        }
        for key, s in report.items()
    }


def tenant_kv_from_json(value: Any) -> dict[str, TenantKVStats]:
    """A report from the engine server's stats JSON; an older server sends none ({}).

    A malformed one raises ValueError, KeyError or TypeError (a failed poll)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError("tenant_kv must be an object")
    return {
        str(key): TenantKVStats(
            blocks_in_use=int(s["blocks_in_use"]),
            preemptions_suffered=int(s["preemptions_suffered"]),
            preemptions_caused=int(s["preemptions_caused"]),
        )
        for key, s in value.items()
    }
