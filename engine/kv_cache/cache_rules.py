"""Cache rules pushed into a running engine: per-domain overrides and published prefixes.

A rule is set on a root name and covers the domain of that name and every domain
below it ("<root>/..."): a rule on a tenant's domain "t:a" also covers its keys'
domains "t:a/k:1". Where several roots match, the longest wins; a domain no rule
matches uses the engine's defaults (`CacheConfig`).

Both classes are frozen, validated on construction and picklable, so that a
`ProcessEngine` can send them to its child as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DomainRule:
    """Cache rules for every domain rooted at one name: the domain itself and "<root>/..."."""

    floor_blocks: int | None = None  # None: the engine default
    floor_share: float | None = None  # of the pool; floor = max(blocks, share*pool) of those given
    retention_ttl_s: float | None = None  # None: the engine default
    scrub_freed_blocks: bool | None = None  # None: the engine default
    # Hard cap on the KV blocks the running sequences of the tenant whose fairness key is
    # this root may hold at once (None: no cap); read by the scheduler, not the cache.
    kv_quota_blocks: int | None = None

    def __post_init__(self) -> None:
        fb = self.floor_blocks
        if fb is not None and (isinstance(fb, bool) or not isinstance(fb, int) or fb < 0):
            raise ValueError(f"floor_blocks must be a non-negative integer, not {fb!r}")
        fs = self.floor_share
        if fs is not None and (
            isinstance(fs, bool) or not isinstance(fs, int | float) or not 0.0 <= fs <= 1.0
        ):
            raise ValueError(f"floor_share must be a number in [0, 1], not {fs!r}")
        ttl = self.retention_ttl_s
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or math.isnan(ttl) or ttl <= 0
        ):
            raise ValueError(f"retention_ttl_s must be a positive number of seconds, not {ttl!r}")
        quota = self.kv_quota_blocks
        if quota is not None and (
            isinstance(quota, bool) or not isinstance(quota, int) or quota < 1
        ):
            raise ValueError(f"kv_quota_blocks must be a positive integer, not {quota!r}")
        scrub = self.scrub_freed_blocks
        if scrub is not None and not isinstance(scrub, bool):
            raise ValueError(f"scrub_freed_blocks must be a boolean, not {scrub!r}")

    @property
    def has_floor(self) -> bool:
        """Whether this rule sets a floor (otherwise the engine default applies)."""
        return self.floor_blocks is not None or self.floor_share is not None

    def floor(self, num_blocks: int) -> int:
        """The floor this rule sets, in blocks of a pool of `num_blocks` (0 if none given)."""
        share = 0 if self.floor_share is None else int(self.floor_share * num_blocks)
        return max(self.floor_blocks or 0, share)


def _check_root(root: object) -> str:
    if not isinstance(root, str) or not root:
        raise ValueError(f"a rule's root must be a non-empty string, not {root!r}")
    if any(c.isspace() for c in root):
        raise ValueError(f"a rule's root must not contain whitespace: {root!r}")
    return root


def _check_prefix(prefix: object) -> tuple[int, ...]:
    if isinstance(prefix, str | bytes) or not hasattr(prefix, "__iter__"):
        raise ValueError(f"a published prefix is a sequence of token ids, not {prefix!r}")
    tokens = tuple(prefix)
    if not tokens:
        raise ValueError("a published prefix must not be empty")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"a published prefix holds non-negative token ids, not {t!r}")
    return tokens


@dataclass(frozen=True)
class CacheRules:
    """Everything the registry pushes into one running engine's cache, replacing the last push."""

    domains: tuple[tuple[str, DomainRule], ...] = ()  # root -> rule
    published: tuple[tuple[int, ...], ...] = ()  # token ids of every published prefix

    def __post_init__(self) -> None:
        # Lists are accepted and frozen into tuples, so that the rules stay hashable.
        domains: list[tuple[str, DomainRule]] = []
        seen: set[str] = set()
        for entry in self.domains:
            try:
                root, rule = entry
            except (TypeError, ValueError):
                raise ValueError(
                    f"a domain rule is a (root, DomainRule) pair, not {entry!r}"
                ) from None
            root = _check_root(root)
            if not isinstance(rule, DomainRule):
                raise ValueError(f"the rule of {root!r} is not a DomainRule: {rule!r}")
            if root in seen:
                raise ValueError(f"two rules for the root {root!r}")
            seen.add(root)
            domains.append((root, rule))
        published = tuple(dict.fromkeys(_check_prefix(p) for p in self.published))
        object.__setattr__(self, "domains", tuple(domains))
        object.__setattr__(self, "published", published)

    def rule_map(self) -> dict[str, DomainRule]:
        """root -> rule."""
        return dict(self.domains)


def match_rule(rules: Mapping[str, DomainRule], domain: str) -> DomainRule | None:
    """The rule of the longest root that is `domain` or an ancestor of it ("<root>/...")."""
    if not rules:
        return None
    name = domain
    while True:
        rule = rules.get(name)
        if rule is not None:
            return rule
        cut = name.rfind("/")
        if cut <= 0:
            return None
        name = name[:cut]
