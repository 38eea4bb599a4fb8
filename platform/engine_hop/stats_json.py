"""The engine's figures in the JSON of the engine server's GET /internal/stats, and back.

The engine server writes them (`*_to_json`); the gateway's remote client reads them back
from its stats poll (`*_from_json`):

- speculative decoding's counters (`engine.stats.EngineStats.spec_decode`);
- per-tenant KV use (`engine.stats.EngineStats.tenant_kv`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.speculative.stats import SpecDecodeStats
from engine.stats import TenantKVStats

_COUNTS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def spec_decode_to_json(stats: SpecDecodeStats | None) -> dict[str, Any] | None:
    """The engine server's form: the three counts and the per-position list; None (null)
    where speculation is off."""
    if stats is None:
        return None
    return {
        **{name: int(getattr(stats, name)) for name in _COUNTS},
        "accepted_per_pos": [int(n) for n in stats.accepted_per_pos],
    }


def spec_decode_from_json(value: Any) -> SpecDecodeStats | None:
    """The counters from a stats poll; None where the server sent none (off, or a server
    older than speculation) or a form this gateway cannot read (a server of another
    version): like the KV tiers, that leaves the figures out rather than failing the poll."""
    if not isinstance(value, dict):
        return None
    if not all(name in value for name in _COUNTS):
        return None
    drafts, draft_tokens, accepted = (value[name] for name in _COUNTS)
    per_pos = value.get("accepted_per_pos") or []
    if not isinstance(per_pos, list) or any(
        isinstance(n, bool) or not isinstance(n, int) or n < 0
        for n in [drafts, draft_tokens, accepted, *per_pos]
    ):
        return None
    return SpecDecodeStats(
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_pos=tuple(per_pos),
    )


def tenant_kv_to_json(report: Mapping[str, TenantKVStats]) -> dict[str, dict[str, int]]:
    """The engine server's form of a per-tenant KV report: key -> the three figures by name."""
    return {
        key: {
            "blocks_in_use": s.blocks_in_use,
            "preemptions_suffered": s.preemptions_suffered,
            "preemptions_caused": s.preemptions_caused,
        }
        for key, s in report.items()
    }


def tenant_kv_from_json(value: Any) -> dict[str, TenantKVStats]:
    """A per-tenant KV report from a stats poll; an older server sends none ({}).

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
