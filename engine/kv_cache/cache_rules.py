"""Per-domain cache rules and published prefixes pushed to a running engine.

Placeholder of the interface agreed with the engine side (helper h1a owns this module;
its version replaces this one at merge).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DomainRule:
    """Rules for every cache domain rooted at one name: the domain and "<root>/..."."""

    floor_blocks: int | None = None
    floor_share: float | None = None
    retention_ttl_s: float | None = None
    scrub_freed_blocks: bool | None = None  # None: engine default


@dataclass(frozen=True)
class CacheRules:
    """The whole set of rules; a push replaces the previous one entirely."""

    domains: tuple[tuple[str, DomainRule], ...] = ()  # root -> rule
    published: tuple[tuple[int, ...], ...] = ()  # token ids of every published prefix
