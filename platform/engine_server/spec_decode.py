"""Speculative decoding's counters (`engine.stats.EngineStats.spec_decode`) in the JSON of
the engine server's GET /internal/stats, and back in the gateway's remote client."""

from __future__ import annotations

from typing import Any

from engine.speculative.stats import SpecDecodeStats

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
