"""Builds the waiting queue that implements `SchedulerConfig.scheduling_policy`."""

from __future__ import annotations

from engine.config import SchedulerConfig
from engine.kv_cache.manager import KVCacheManager
from engine.scheduler.fair import FairQueue
from engine.scheduler.lpm import LpmQueue
from engine.scheduler.queue import FcfsQueue, WaitingQueue


def make_waiting_queue(config: SchedulerConfig, kv: KVCacheManager) -> WaitingQueue:
    """`fcfs`, `lpm` (longest prefix match within a domain) or `fair` (virtual token counter)."""
    policy = config.scheduling_policy
    if policy == "fcfs":
        queue: WaitingQueue = FcfsQueue()
    elif policy == "lpm":
        queue = LpmQueue(kv)
    elif policy == "fair":
        queue = FairQueue()
    else:
        raise ValueError(f"unknown scheduling_policy {policy!r}; use 'fcfs', 'lpm' or 'fair'")
    for domain, weight in config.domain_weights:
        queue.set_weight(domain, weight)
    return queue
