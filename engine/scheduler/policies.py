"""Builds the waiting queue that implements `SchedulerConfig.scheduling_policy`."""

from __future__ import annotations

from engine.config import SchedulerConfig
from engine.kv_cache.manager import KVCacheManager
from engine.scheduler.fair import FairQueue
from engine.scheduler.lpm import LpmQueue
from engine.scheduler.queue import FcfsQueue, WaitingQueue
from engine.scheduler.tenants import TenantBook

POLICIES = ("fcfs", "lpm", "fair", "fair_lpm")


def make_waiting_queue(
    config: SchedulerConfig, kv: KVCacheManager, book: TenantBook | None = None
) -> WaitingQueue:
    """`fcfs`, `lpm` (longest prefix match within a domain), `fair` (virtual token counter
    across tenants, FCFS within one) or `fair_lpm` (fair across tenants, longest prefix
    match within one). `book` holds the tenants' weights (the config's, when not given)."""
    policy = config.scheduling_policy
    if book is None:
        book = TenantBook(dict(config.domain_weights))
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "lpm":
        return LpmQueue(kv)
    if policy == "fair":
        return FairQueue(book=book)
    if policy == "fair_lpm":
        return FairQueue(book=book, kv=kv)
    raise ValueError(f"unknown scheduling_policy {policy!r}; use one of {', '.join(POLICIES)}")
