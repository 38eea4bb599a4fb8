"""Per-sequence block tables on top of the shared block pool, with tenant-isolated prefix reuse.

The scheduler talks to this class only (never to the pool or the index):

    get_computed_blocks(seq)   cached blocks holding a prefix of seq (lookup)
    allocate_slots(seq, n, computed_blocks)   adopt those, make room for n more tokens
    cache_full_blocks(seq)     register blocks the last step filled (after update)
    free(seq)                  release; cached blocks stay, idle, until evicted

A sequence's blocks split into at most two chain segments: the full blocks of a
published prefix (public key, shared by every domain) and the rest, under the
sequence's own `CacheKey` (continued from the published prefix, if any):

    block:    0    1    2  |  3    4    5 ...
    root:     public key   |  key(domain, adapter, revision).continuation(published)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq

from engine.config import CacheConfig
from engine.kv_cache.block_meta import BlockMeta, ChainSegment, SeqCacheState
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.cache_key import CacheKey, block_hash
from engine.kv_cache.cache_rules import CacheRules
from engine.kv_cache.counters import IDLE_DOMAIN_COUNTERS, DomainActivity, DomainCacheStats
from engine.kv_cache.eviction import PUBLIC, CachePolicy, EvictionLedger
from engine.kv_cache.host_tier import KVTier
from engine.kv_cache.in_flight import InFlightPrefixes, flight_keys
from engine.kv_cache.index_factory import make_prefix_index
from engine.kv_cache.integrity import check_manager_integrity
from engine.kv_cache.kv_events import KVEventLog
from engine.kv_cache.prefix_index import PrefixIndex
from engine.kv_cache.published import PublishedPrefixes
from engine.kv_cache.tier_cost import LoadCostRule
from engine.kv_cache.tier_loads import LoadingBlocks, doomed
from engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


class KVCacheManager:
    """Allocates, caches, shares and evicts the blocks of each sequence's block table.

    Block table layout: token t of a sequence lives in `seq.block_ids[t // block_size]`
    at offset `t % block_size`. Without an index (`prefix_cache="off"`) nothing is cached.
    """

    def __init__(
        self,
        pool: BlockPool,
        block_size: int,
        *,
        index: PrefixIndex | None = None,
        revision: str = "",
        policy: CachePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        window: int | None = None,
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        # The model's window when every layer has one (ModelArchitecture.kv_window): the
        # blocks behind a sequence's last `window` positions are given back as it moves
        # on (`release_behind_window`). The prefix cache then keeps only the blocks
        # within a sequence's first `window` tokens: a cached chain is evicted from its
        # tail, so a longer one would hold every block behind it until the sequence ends.
        self.window = window
        self._cache_limit = None if window is None else window // block_size
        self.index = index
        self.revision = revision
        self.policy = policy or CachePolicy()
        self.clock = clock
        self.ledger = EvictionLedger(pool.num_blocks, self.policy)
        self.lookup_work = 0  # probes or nodes visited by all lookups (for tests)
        self.keyed_blocks = 0  # block keys (hashes) computed, all sequences (for tests)
        self.query_tokens = 0
        self.hit_tokens = 0
        self._meta: dict[int, BlockMeta] = {}
        self._pinned: set[int] = set()
        self._seqs: dict[str, SeqCacheState] = {}
        # Configured (`publish_prefix`) and pushed (`apply_rules`) published prefixes.
        self._published = PublishedPrefixes(block_size)
        self._rules = CacheRules()  # the last push
        self._public: set[int] = set()  # registered blocks of the public domain
        # Maps per domain, pruned when the domain goes idle (see `_maybe_idle`).
        self._keys: dict[str, dict[str | None, CacheKey]] = {}
        self._activity = DomainActivity(IDLE_DOMAIN_COUNTERS)
        self._to_scrub: list[int] = []
        self._tick = 0
        self._in_flight = InFlightPrefixes(block_size)
        self.events: KVEventLog | None = None  # KV-cache events: None until asked for
        # The host tier (L2) under the pool and the rule that decides whether its hits
        # are loaded (`attach_tier`); None: evicted blocks are simply forgotten.
        self.tier: KVTier | None = None
        self.tier_cost: LoadCostRule | None = None
        # Blocks whose tier loads are joined later (`track_loads`, tier_loads.py); None:
        # every load is in before the next forward pass.
        self.loading: LoadingBlocks | None = None

    @classmethod
    def from_config(
        cls, cache: CacheConfig, num_blocks: int, revision: str, window: int | None = None
    ) -> KVCacheManager:
        """The manager `CacheConfig` describes, over a new pool of `num_blocks` blocks
        (`window`: the model's window on every layer, if it has one)."""
        policy = CachePolicy(
            min_cached_blocks=cache.min_cached_blocks,
            min_cached_share=cache.min_cached_share,
            fair_cached_share=cache.fair_cached_share,
            strict=cache.strict_partition,
            retention_ttl_s=cache.retention_ttl_s,
            scrub_freed_blocks=cache.scrub_freed_blocks,
        )
        manager = cls(
            BlockPool(num_blocks),
            cache.block_size,
            index=make_prefix_index(cache.prefix_cache, cache.block_size),
            revision=revision,
            policy=policy,
            window=window,
        )
        for prefix in cache.published_prefixes:
            manager.publish_prefix(prefix)
        return manager

    def record_events(self, medium: str) -> KVEventLog:
        """Starts logging the cache's changes as KV-cache events (vLLM's format); the
        log opens with `AllBlocksCleared`, since no block is cached yet."""
        if self.events is None:
            self.events = KVEventLog(self.block_size, medium)
            self.events.cleared()
            if self.tier is not None:
                self.tier.record_events(self.events)  # the tiers' blocks, their medium
        return self.events

    def attach_tier(self, tier: KVTier, cost: LoadCostRule | None = None) -> None:
        """Puts `tier` under the pool: evicted cached blocks are written down to it, and
        a lookup that misses the pool continues the same chain in it. `cost` decides
        whether a hit there is loaded or recomputed (None: always loaded)."""
        if self.index is None:
            raise ValueError("a KV tier needs the prefix cache (prefix_cache='off')")
        self.tier = tier
        self.tier_cost = cost
        if self.events is not None:
            tier.record_events(self.events)

    def track_loads(self) -> None:
        """Tier loads run off the step's path from now on: each loaded block stays held,
        and the sequences over it not `ready`, until `finish_loads` says it is in."""
        if self.loading is None:
            self.loading = LoadingBlocks()

    def ready(self, seq: Sequence) -> bool:
        """False while a block of the sequence's table is still being loaded."""
        return self.loading is None or not self.loading.any_in(seq.held_block_ids)

    def finish_loads(
        self, done: list[int], failed: list[int], requeue: Callable[[set[int]], None]
    ) -> None:
        """Ends loads (none may be in flight when one failed): `done` blocks are ready;
        `failed` ones, and the cached blocks chained under them, are dropped from the
        device and the tiers, after `requeue` has sent the sequences holding any of them
        back to be recomputed (they give their references back)."""
        assert self.loading is not None and self.tier is not None
        bad = doomed(failed, self._meta)
        if bad:
            requeue(bad)
        for b in self.loading.finish(done + failed):
            self._release([b], self._meta[b].domain)  # the load's own reference
        for b in failed:
            self.tier.discard(self._meta[b].tier_key)
        while bad:
            leaves = [b for b in bad if self._meta[b].children == 0]
            assert leaves and all(self.pool.is_idle(b) for b in leaves), "a failed load is held"
            for b in leaves:
                self._evict(b)
                bad.discard(b)

    @property
    def num_blocks(self) -> int:
        """Blocks in the whole pool."""
        return self.pool.num_blocks

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (idle cached blocks count as free)."""
        return self.pool.usage

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return cdiv(num_tokens, self.block_size)

    def _cacheable(self, num_blocks: int) -> int:
        """Of a sequence's first `num_blocks` blocks, how many the prefix cache may keep."""
        limit = self._cache_limit
        return num_blocks if limit is None else min(num_blocks, limit)

    # -- configuration ------------------------------------------------------------------

    def publish_prefix(self, token_ids: Seq[int]) -> int:
        """Shares the full blocks of `token_ids` with every domain; returns how many blocks."""
        n = self._published.publish(token_ids)
        if n:
            self._sync_pins()
        return n

    def apply_rules(self, rules: CacheRules) -> None:
        """Replaces the per-domain rules and the pushed set of published prefixes.

        A rule on root R covers domain R and every domain "R/..." (the longest root
        wins); other domains keep the defaults of `CacheConfig`. Prefixes of
        `publish_prefix` stay published whatever is pushed. A withdrawn prefix stops
        matching at once: its blocks lose their pin and are evicted as soon as no
        sequence holds them (sequences running over them keep them until they end).
        """
        if not isinstance(rules, CacheRules):
            raise TypeError(f"apply_rules takes CacheRules, not {type(rules).__name__}")
        if rules == self._rules:
            return  # the registry pushes every few seconds, mostly the same rules
        self._rules = rules
        self.ledger.set_rules(rules.rule_map())
        self._published.replace_pushed(rules.published)
        # A plan made at a lookup that found no room yet is made again at the next one,
        # so that it sees the new set of published prefixes.
        for seq_id, st in list(self._seqs.items()):
            if not st.admitted:
                del self._seqs[seq_id]
                self._seq_ended(st.domain)
        self._sync_pins()

    def _sync_pins(self) -> None:
        """Pins the public blocks of published prefixes and unpins the others."""
        for b in sorted(self._public):
            meta = self._meta.get(b)
            if meta is None:
                continue  # evicted below with a withdrawn child
            should = self._published.covers(meta.prefix, meta.depth)
            if should and b not in self._pinned:
                # Re-published while a sequence still held it.
                self._acquire([b])
                self._pinned.add(b)
            elif not should and b in self._pinned:
                self._pinned.discard(b)
                self._release([b], PUBLIC)  # evicted at once if nobody holds it

    def kv_quota(self, fairness_key: str) -> int | None:
        """The hard cap on blocks the running sequences of `fairness_key` may hold: the
        `kv_quota_blocks` of the rule on that root, if any (the scheduler enforces it)."""
        rule = self.ledger.rule(fairness_key)
        return None if rule is None else rule.kv_quota_blocks

    # -- lookup -------------------------------------------------------------------------

    def _key(self, seq: Sequence) -> CacheKey:
        keys = self._keys.setdefault(seq.cache_domain, {})
        adapter = seq.cache_adapter
        key = keys.get(adapter)
        if key is None:
            key = keys[adapter] = CacheKey.derive(seq.cache_domain, adapter, self.revision)
        return key

    def _plan(self, seq: Sequence) -> SeqCacheState:
        key = self._key(seq)
        prompt = seq.prompt_token_ids
        best = self._published.longest_prefix_of(prompt)
        domain = seq.cache_domain
        if not best:
            return SeqCacheState(domain, (ChainSegment(key.digest, domain, 0, None),))
        n = len(best) // self.block_size
        public = CacheKey.public(seq.cache_adapter, self.revision)
        rest = key.continuation(self._published.digest(best))
        return SeqCacheState(
            domain,
            (ChainSegment(public.digest, PUBLIC, 0, n, best), ChainSegment(rest, domain, n, None)),
        )

    def _state(self, seq: Sequence) -> SeqCacheState:
        st = self._seqs.get(seq.seq_id)
        if st is None:
            st = self._seqs[seq.seq_id] = self._plan(seq)
            self._activity.started(st.domain)
        return st

    def _extend_keys(self, seq: Sequence, st: SeqCacheState, n: int) -> None:
        """Cuts and keys the sequence's blocks up to its first `n`, each only once."""
        assert self.index is not None
        bs = self.block_size
        i = len(st.keys)
        while i < n:
            seg = next(s for s in st.segments if s.end is None or i < s.end)
            chunk = tuple(seq.token_ids(i * bs, (i + 1) * bs))
            parent = None if i == seg.start else st.keys[i - 1]
            st.chunks.append(chunk)
            st.keys.append(self.index.block_key(seg.root, parent, chunk))
            self.keyed_blocks += 1
            i += 1

    def _match(self, seq: Sequence, st: SeqCacheState) -> list[int]:
        assert self.index is not None
        # Never the last token: at least one must be computed to get logits.
        max_blocks = self._cacheable((seq.num_tokens - 1) // self.block_size)
        self._extend_keys(seq, st, max_blocks)
        found: list[int] = []
        for seg in st.segments:
            end = max_blocks if seg.end is None else min(seg.end, max_blocks)
            if len(found) < seg.start or end <= seg.start:
                break
            result = self.index.match_keys(
                seg.root, st.chunks[seg.start : end], st.keys[seg.start : end]
            )
            self.lookup_work += result.work
            found.extend(result.block_ids)
            if len(result.block_ids) < end - seg.start:
                break
        return found

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[int], int]:
        """Cached blocks holding a block-aligned prefix of `seq`, and the tokens they cover."""
        if self.index is None or not seq.use_cache:
            return [], 0
        self._expire()
        st = self._state(seq)
        found = self._match(seq, st)
        if self.tier is not None:
            found.extend(self._load_from_tier(seq, st, found))
        st.pending = (seq.num_tokens, len(found) * self.block_size)
        return found, len(found) * self.block_size

    def _tier_keys(self, st: SeqCacheState, n: int) -> list[bytes]:
        """The chained block hashes of the state's first `n` blocks (chunks cut already)."""
        assert self.index is not None
        if self.index.name == "hash":
            return st.keys[:n]  # type: ignore[return-value]  # this index's keys are hashes
        while len(st.tier_keys) < n:
            i = len(st.tier_keys)
            seg = next(s for s in st.segments if s.end is None or i < s.end)
            parent = seg.root if i == seg.start else st.tier_keys[i - 1]
            st.tier_keys.append(block_hash(parent, st.chunks[i]))
        return st.tier_keys[:n]

    def _load_from_tier(self, seq: Sequence, st: SeqCacheState, found: list[int]) -> list[int]:
        """Continues the device lookup of `seq` in the tier: each further block held
        there gets a device block, registered as cached, with a load queued into it.

        Only the sequence's own segment (its domain's root) continues: published
        blocks are pinned in the pool and never written down. Returns the loaded blocks,
        which follow `found` and are idle cached blocks like any device hit (with
        `track_loads`: held by their loads until `finish_loads`).
        """
        assert self.index is not None and self.tier is not None
        n = len(found)
        max_blocks = self._cacheable((seq.num_tokens - 1) // self.block_size)
        if n >= max_blocks:
            return []
        seg = next(s for s in st.segments if s.end is None or n < s.end)
        if seg.domain == PUBLIC:
            return []
        keys = self._tier_keys(st, max_blocks)
        tier = self.tier
        now = self.clock()
        # Counts the lookup, and each tier's own hits, in that tier.
        slots = tier.match(keys[n:max_blocks], st.chunks[n:max_blocks], now)
        if not slots:
            return []
        if self.tier_cost is not None and not self.tier_cost.worth_loading(len(slots)):
            tier.recomputed(slots)
            return []
        # Held while loading, so that making room never evicts the chain being extended.
        if found:
            self._acquire(found)
        loaded: list[int] = []
        try:
            for i in range(n, n + len(slots)):
                own = len(found) + len(loaded)
                if not self._partition_room(seg.domain):
                    break
                if self.pool.num_uncached_free == 0 and not self._make_room(1, seg.domain, own):
                    break
                (block,) = self.pool.allocate(1)
                # Making room wrote other blocks down, which may have displaced this one.
                if not tier.load(keys[i], st.chunks[i], block, now):
                    self.pool.free([block])
                    break
                parent = None if i == seg.start else (found + loaded)[i - 1]
                (canon,) = self.index.insert_keys(
                    seg.root, parent, st.chunks[i : i + 1], st.keys[i : i + 1], [block]
                )
                assert canon == block, "a tier hit was already in the device index"
                self._register(block, seg.domain, parent, seg.prefix, i)
                meta = self._meta[block]
                meta.tier_key, meta.chunk = keys[i], st.chunks[i]
                if block in self._to_scrub:
                    self._to_scrub.remove(block)  # the load overwrites all of it
                if self.events is not None:
                    self.events.stored(
                        block, parent, seg.root, st.chunks[i], st.keys[i], seg.domain,
                        seq.cache_adapter,
                    )  # fmt: skip
                loaded.append(block)
                if self.loading is not None:
                    self.loading.begin(block)  # its allocation is the load's reference
        finally:
            held = loaded if self.loading is None else []
            if found or held:
                self._release(found + held, seg.domain)
        return loaded

    def prefix_in_flight(self, seq: Sequence, num_computed: int) -> bool:
        """Whether the first block of `seq` past its cached `num_computed` tokens is being
        computed now by another running sequence of its domain (then it should wait for
        that block rather than compute it again); after `get_computed_blocks`."""
        st = self._seqs.get(seq.seq_id)
        if st is None or self.index is None or not seq.use_cache:
            return False
        block = num_computed // self.block_size
        return self._in_flight.computing(seq, flight_keys(st, len(st.chunks)), block)

    def match_length(self, seq: Sequence) -> int:
        """Tokens of `seq` the cache would serve now (for queue ordering).

        Changes nothing in the cache or its counters; it keeps the sequence's block
        keys, so that the next lookup of the same waiting sequence computes none.
        """
        if self.index is None or not seq.use_cache:
            return 0
        work = self.lookup_work
        n = len(self._match(seq, self._state(seq)))
        self.lookup_work = work
        return n * self.block_size

    # -- allocation ---------------------------------------------------------------------

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, computed_blocks: list[int] | None = None
    ) -> bool:
        """Makes room for `num_new_tokens` more tokens of `seq`; False if the pool is short.

        On False nothing changed that matters (adopted blocks go back to idle).
        `computed_blocks` (only on first admission) are prefix blocks the sequence
        adopts instead of computing them.
        """
        computed = computed_blocks or []
        fresh = not seq.block_ids
        have = len(seq.block_ids) + len(computed)
        need = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - have
        if computed:
            self._acquire(computed)
        own = seq.num_held_blocks + len(computed)
        if need > 0 and not self._make_room(need, seq.cache_domain, own):
            if computed:
                self._release(computed, seq.cache_domain)
            return False
        seq.block_ids.extend(computed)
        if need > 0:
            seq.block_ids.extend(self.pool.allocate(need))
        if fresh and self.index is not None and seq.use_cache:
            self._adopted(seq, len(computed))
            st = self._state(seq)
            self._in_flight.claim(seq, flight_keys(st, len(st.chunks)), len(computed))
        return True

    def _adopted(self, seq: Sequence, n: int) -> None:
        assert self.index is not None
        st = self._state(seq)
        st.admitted = True
        st.registered = n
        for i, seg in enumerate(st.segments):
            last = n if seg.end is None else min(seg.end, n)
            if last > seg.start:
                self.index.lock(seq.block_ids[last - 1])
                st.locked[i] = seq.block_ids[last - 1]
        if st.pending is not None:
            queried, hit = st.pending
            st.pending = None
            c = self._activity.counters_of(seq.cache_domain)
            c.queries += 1
            c.hits += hit > 0
            c.query_tokens += queried
            c.cached_tokens += hit
            self.query_tokens += queried
            self.hit_tokens += hit

    def _make_room(self, need: int, domain: str, own: int) -> bool:
        """Frees `need` blocks for a sequence of `domain` that already holds `own` blocks."""
        short = need - self.pool.num_uncached_free
        if short <= 0:
            return True
        ignore_floors = False
        if self.ledger.evictable_for(domain) < short:
            # Floors give way only when no other sequence holds blocks: waiting could not
            # help then, and a lone sequence that cannot grow would be preempted and
            # re-admitted forever (a strict partition smaller than one request).
            in_use_by_others = self.num_blocks - self.pool.num_free - len(self._pinned) - own
            if in_use_by_others > 0 or self.pool.num_idle < short:
                return False
            ignore_floors = True
        for _ in range(short):
            victim = self.ledger.victim(domain, ignore_floors=ignore_floors)
            if victim is None:
                return False
            self._evict(victim, write_down=True)
        return True

    def _acquire(self, blocks: list[int]) -> None:
        for b in self.pool.incref(blocks):
            self.ledger.idle[self._meta[b].domain] -= 1
            self.ledger.drop_candidate(b)

    def _release(self, blocks: list[int], domain: str) -> None:
        """Drops one reference from each block; `domain` held the uncached ones."""
        now = self.clock()
        withdrawn: list[int] = []
        for b in self.pool.free(blocks):
            meta = self._meta.get(b)
            if meta is None:
                if self.ledger.scrub(domain):
                    self._to_scrub.append(b)
                continue
            self._tick += 1
            meta.tick, meta.last_used = self._tick, now
            self.ledger.idle[meta.domain] += 1
            if meta.children == 0:
                self.ledger.add_candidate(b, meta.domain, meta.tick, now)
            if meta.domain == PUBLIC and b not in self._pinned:
                withdrawn.append(b)
        if withdrawn:
            self._drop_withdrawn(withdrawn)

    def _drop_withdrawn(self, blocks: list[int]) -> None:
        """Evicts idle blocks of withdrawn prefixes, tail first, up to a published one."""
        work = list(blocks)
        while work:
            b = work.pop()
            meta = self._meta.get(b)
            if meta is None or meta.domain != PUBLIC or b in self._pinned:
                continue
            if not self.ledger.is_candidate(b):
                continue  # still held, or it has cached children (each comes back here)
            self._evict(b)
            if meta.parent is not None:
                work.append(meta.parent)

    def _evict(self, block_id: int, *, write_down: bool = False) -> None:
        """Forgets an idle cached block; `write_down` (evicted for room, not expired or
        withdrawn) keeps it in the tier under its own key first."""
        assert self.index is not None
        meta = self._meta.pop(block_id)
        if write_down and self.tier is not None and meta.tier_key:
            self.tier.store(meta.tier_key, meta.chunk, meta.domain, meta.last_used, block_id)
        self.index.remove(block_id)
        self.pool.evict(block_id)
        self.ledger.drop_candidate(block_id)
        self.ledger.cached[meta.domain] -= 1
        self.ledger.idle[meta.domain] -= 1
        self._activity.counters_of(meta.domain).evictions += 1
        self._public.discard(block_id)
        if self.events is not None:
            self.events.removed(block_id)
        if self.ledger.scrub(meta.domain):
            self._to_scrub.append(block_id)
        if meta.parent is not None:
            parent = self._meta[meta.parent]
            parent.children -= 1
            if parent.children == 0 and self.pool.is_idle(meta.parent):
                self.ledger.add_candidate(meta.parent, parent.domain, parent.tick, parent.last_used)
        self._maybe_idle(meta.domain)

    def _expire(self) -> None:
        if not self.ledger.has_ttls:
            return
        now = self.clock()
        while expired := self.ledger.expired(now):
            for b in expired:
                self._evict(b)
        if self.tier is not None:
            self.tier.expire(now)

    # -- after a step -------------------------------------------------------------------

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers the blocks of `seq` that are now full of computed tokens.

        A block whose prefix is already cached under another id is swapped for that
        one (identical contents), so every cached path a sequence uses is held by it.
        """
        if self.index is None or not seq.use_cache or not seq.block_ids:
            return
        st = self._state(seq)
        full = self._cacheable(min(seq.num_computed_tokens // self.block_size, len(seq.block_ids)))
        i = st.registered
        if i < full and not st.stopped:
            self._extend_keys(seq, st, full)
        swapped = False
        while i < full and not st.stopped:
            seg_i, seg = next(
                (k, s) for k, s in enumerate(st.segments) if s.end is None or i < s.end
            )
            if not self._partition_room(seg.domain):
                st.stopped = True
                break
            block = seq.block_ids[i]
            parent = None if i == seg.start else seq.block_ids[i - 1]
            (canon,) = self.index.insert_keys(
                seg.root, parent, st.chunks[i : i + 1], st.keys[i : i + 1], [block]
            )
            if canon != block:
                self._acquire([canon])
                seq.block_ids[i] = canon
                swapped = True
                self._release([block], seq.cache_domain)
            else:
                self._register(block, seg.domain, parent, seg.prefix, i)
                if self.tier is not None and seg.domain != PUBLIC:
                    meta = self._meta[block]
                    meta.tier_key, meta.chunk = self._tier_keys(st, i + 1)[i], st.chunks[i]
                if self.events is not None:
                    chunk, key = st.chunks[i], st.keys[i]
                    self.events.stored(
                        block, parent, seg.root, chunk, key, seg.domain, seq.cache_adapter
                    )
            self.index.lock(canon)
            old = st.locked.get(seg_i)
            if old is not None:
                self.index.unlock(old)
            st.locked[seg_i] = canon
            i += 1
        st.registered = i
        if swapped:
            # block_ids may only grow in place; a new list tells the runner's block
            # table (which mirrors it by appended diffs) to resync the whole row.
            seq.block_ids = list(seq.block_ids)

    def _partition_room(self, domain: str) -> bool:
        """In strict mode a domain caches at most its floor: make room from its own LRU."""
        if domain == PUBLIC or not self.policy.strict:
            return True
        if self.ledger.cached[domain] < self.ledger.floor(domain):
            return True
        victim = self.ledger.own_victim(domain)
        if victim is None:
            return False
        self._evict(victim, write_down=True)
        return True

    def _register(
        self, block: int, domain: str, parent: int | None, prefix: tuple[int, ...], depth: int
    ) -> None:
        self.pool.mark_cached(block)
        meta = self._meta[block] = BlockMeta(domain, parent)
        if parent is not None:
            self._meta[parent].children += 1
            self.ledger.drop_candidate(parent)
        self.ledger.cached[domain] += 1
        if domain == PUBLIC:
            meta.prefix, meta.depth = prefix, depth
            self._public.add(block)
            # Published prefixes are pinned: one extra reference, held until withdrawn.
            # A sequence planned before a withdrawal registers its blocks unpinned.
            if self._published.covers(meta.prefix, meta.depth):
                self.pool.incref([block])
                self._pinned.add(block)

    def trim(self, seq: Sequence) -> None:
        """Gives back the blocks past a sequence's known tokens: those a verify step
        allocated for draft tokens it then rejected. They were never registered (only
        blocks full of computed, hence accepted, tokens are), so no rejected token
        reaches the prefix cache; the list is replaced, not shrunk in place, so the
        runner's block table notices."""
        keep = self.blocks_needed(seq.num_tokens)
        if len(seq.block_ids) <= keep:
            return
        tail = seq.block_ids[keep:]
        seq.block_ids = seq.block_ids[:keep]
        self._release(tail, seq.cache_domain)

    def release_behind_window(self, seq: Sequence) -> int:
        """Gives back the leading blocks of `seq` that no later token can see, on a model
        whose every layer has a window W; returns how many. Their entries in
        `block_ids` become 0, the block table's padding, which the attention backends
        never read (they start at the window).

        Call it after a step's result is taken, with `num_computed_tokens` at the next
        step's first position p: that step reads keys from p - W + 1 on. Cached blocks
        go idle, like those of an ended sequence.
        """
        if self.window is None:
            return 0
        first_seen = seq.num_computed_tokens - self.window + 1
        n = min(first_seen // self.block_size, len(seq.block_ids))
        done = seq.num_released_blocks
        if n <= done:
            return 0
        gone = seq.block_ids[done:n]
        st = self._seqs.get(seq.seq_id)
        if st is not None and self.index is not None and st.locked:
            leaving = set(gone)
            for segment, block in list(st.locked.items()):
                if block in leaving:  # the chain's deepest block: it may be evicted now
                    self.index.unlock(block)
                    del st.locked[segment]
        self._release(gone, seq.cache_domain)
        # A new list: the runner's block table resyncs the row (block_table.py).
        seq.block_ids = [0] * n + seq.block_ids[n:]
        seq.num_released_blocks = n
        return n - done

    def free(self, seq: Sequence, *, keep_keys: bool = False) -> None:
        """Releases the sequence's blocks; cached ones stay (idle) until evicted.

        `keep_keys` (a preempted sequence, which will be looked up again) keeps its
        plan and block keys, and nothing else.
        """
        st = self._seqs.pop(seq.seq_id, None)
        self._in_flight.release(seq.seq_id)
        kept = False
        if st is not None and self.index is not None:
            for b in st.locked.values():
                self.index.unlock(b)
            if keep_keys:
                # Still live (it waits to run again): its domain keeps counting it.
                self._seqs[seq.seq_id] = SeqCacheState(
                    st.domain, st.segments, chunks=st.chunks, keys=st.keys, tier_keys=st.tier_keys
                )
                kept = True
        if seq.block_ids:
            self._release(seq.held_block_ids, seq.cache_domain)
            seq.block_ids = []
            seq.num_released_blocks = 0
        if st is not None and not kept:
            self._seq_ended(st.domain)

    # -- bounded per-domain maps --------------------------------------------------------

    def _seq_ended(self, domain: str) -> None:
        if self._activity.ended(domain):
            self._maybe_idle(domain)

    def _maybe_idle(self, domain: str) -> None:
        """Prunes the maps of a domain with nothing cached and no live sequence.

        Its counters (what `domain_stats` reports) stay while it is among the most
        recent `IDLE_DOMAIN_COUNTERS` idle domains; rules and overrides are
        configuration and stay whatever happens.
        """
        if domain == PUBLIC or self.ledger.cached[domain] or domain in self._activity.live:
            return
        self.ledger.forget(domain)
        self._keys.pop(domain, None)
        self._activity.retire(domain)

    def take_blocks_to_scrub(self) -> list[int]:
        """Blocks that left a domain since the last call (to be zeroed before reuse)."""
        out, self._to_scrub = self._to_scrub, []
        return out

    # -- introspection ------------------------------------------------------------------

    def published_prefixes(self) -> set[tuple[int, ...]]:
        """The token ids of every prefix published now (configured and pushed)."""
        return set(self._published)

    @property
    def num_pinned(self) -> int:
        """Blocks of published prefixes, held forever."""
        return len(self._pinned)

    def domain_stats(self) -> dict[str, DomainCacheStats]:
        """Per-domain counters, with the number of blocks each domain has cached now."""
        return self._activity.stats(self.ledger.cached)

    def check_integrity(self) -> None:
        """Pool, index and ledger agree about every cached block (kv_cache.integrity)."""
        check_manager_integrity(self)
