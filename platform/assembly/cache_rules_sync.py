"""Keeps the running engine's cache rules in step with the database.

Every `interval_s` (the server's config_refresh_s) `CacheRulesSync` reads every tenant's
cache policy and the prefixes published for the served model, builds a `CacheRules`,
and pushes it to the engine when it differs from the last push (and once at start). The
database is read off the event loop; when it fails, the last rules stay in force and the
next period tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from assembly.periodic_sync import PeriodicSync
from engine.kv_cache.cache_rules import CacheRules, DomainRule
from tenancy.models import Tenant
from tenancy.scopes import tenant_scope

if TYPE_CHECKING:
    from engine_hop.client import TokenizerLike

log = logging.getLogger("cloister.cache_rules")
MIN_INTERVAL_S = 0.1  # a refresh of 0 (tests) still leaves the loop room to breathe


class CacheRulesTarget(Protocol):
    """The part of an engine client the sync uses."""

    model_name: str

    @property
    def tokenizer(self) -> TokenizerLike:
        """The served model's tokenizer (for prefixes published as text)."""
        ...

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Replaces the engine's rules with `rules`."""
        ...


def tenant_rule(tenant: Tenant) -> DomainRule | None:
    """The engine rule for a tenant's domains; None when it keeps every engine default."""
    rule = DomainRule(
        floor_blocks=tenant.cache_floor_blocks,
        floor_share=tenant.cache_floor_share,
        retention_ttl_s=tenant.retention_ttl_s,
        scrub_freed_blocks=tenant.scrub_on_free,
        kv_quota_blocks=tenant.kv_quota_blocks,
    )
    return None if rule == DomainRule() else rule


def read_cache_rules(session: Session, *, model: str, tokenizer: TokenizerLike) -> CacheRules:
    """The rules the database asks for: tenant rules by domain root, published prefixes
    of `model` by name (text ones tokenized without special tokens)."""
    from admin.models import SharedPrefix

    domains = []
    for tenant in session.scalars(select(Tenant).order_by(Tenant.id)):
        try:
            rule = tenant_rule(tenant)
        except ValueError:  # a row written around the store's checks: skip it, keep the rest
            log.error("tenant %s has an invalid cache policy; ignored", tenant.id)
            continue
        if rule is not None:
            domains.append((tenant_scope(tenant.id), rule))
    published = []
    rows = session.scalars(
        select(SharedPrefix).where(SharedPrefix.model == model).order_by(SharedPrefix.name)
    )
    for row in rows:
        if row.token_ids is not None:
            ids = tuple(int(t) for t in row.token_ids)
        else:
            ids = tuple(tokenizer.encode(row.text or "", add_special_tokens=False))
        if ids:
            published.append(ids)
    return CacheRules(domains=tuple(sorted(domains)), published=tuple(published))


class CacheRulesSync(PeriodicSync):
    """Pushes the database's cache rules to one engine client, periodically."""

    task_name = "cache-rules-sync"

    def __init__(
        self,
        client: CacheRulesTarget,
        sessions: Callable[[], Session],
        *,
        interval_s: float,
    ) -> None:
        self._client = client
        self._sessions = sessions
        super().__init__(max(MIN_INTERVAL_S, interval_s))
        self._last: CacheRules | None = None

    @property
    def last_pushed(self) -> CacheRules | None:
        """The rules the engine last accepted (None: none yet)."""
        return self._last

    def _read(self) -> CacheRules:
        with self._sessions() as session:
            return read_cache_rules(
                session, model=self._client.model_name, tokenizer=self._client.tokenizer
            )

    async def sync_once(self) -> bool:
        """Reads and, when changed, pushes; True when a push happened. Never raises
        for a database or engine failure: it is logged and the last rules stay."""
        try:
            rules = await asyncio.to_thread(self._read)
        except Exception:  # noqa: BLE001  (any read failure: retry next period)
            log.exception("reading cache rules failed; the last rules stay in force")
            return False
        if rules == self._last:
            return False
        try:
            await self._client.update_cache_rules(rules)
        except Exception:  # noqa: BLE001  (an engine refusal must not stop the loop)
            log.exception("pushing cache rules to the engine failed; retrying next period")
            return False
        self._last = rules
        log.info(
            "cache rules pushed: %d tenant rules, %d published prefixes",
            len(rules.domains),
            len(rules.published),
        )
        return True
