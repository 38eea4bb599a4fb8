"""Per-tenant KV use as the engines report it (`engine.stats.TenantKVStats`, keyed by
fairness key, "t:<tenant id>" from the gateway): summed over replicas, and the tenant id
behind a key. The engine server's JSON form is engine_hop/stats_json.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.stats import TenantKVStats


def sum_tenant_kv(
    reports: Iterable[Mapping[str, TenantKVStats]],
) -> dict[str, TenantKVStats]:
    """Each key's blocks and preemptions summed over several engines' reports."""
    out: dict[str, TenantKVStats] = {}
    for report in reports:
        for key, s in report.items():
            before = out.get(key)
            out[key] = (
                s
                if before is None
                else TenantKVStats(
                    blocks_in_use=before.blocks_in_use + s.blocks_in_use,
                    preemptions_suffered=before.preemptions_suffered + s.preemptions_suffered,
                    preemptions_caused=before.preemptions_caused + s.preemptions_caused,
                )
            )
    return out
