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
from dataclasses import dataclass, field

from engine.config import CacheConfig
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.cache_key import CacheKey, tokens_digest
from engine.kv_cache.counters import DomainCacheStats, DomainCounters
from engine.kv_cache.eviction import PUBLIC, CachePolicy, EvictionLedger
from engine.kv_cache.prefix_index import BlockKey, Chunk, PrefixIndex, make_prefix_index
from engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(-a // b)


@dataclass
class _Meta:
    domain: str
    parent: int | None
    children: int = 0
    tick: int = 0
    last_used: float = 0.0


@dataclass(frozen=True)
class _Segment:
    root: bytes
    domain: str
    start: int  # first block index
    end: int | None  # one past the last block index; None: open-ended


@dataclass
class _SeqCache:
    segments: tuple[_Segment, ...]
    registered: int = 0  # leading blocks of seq.block_ids that are registered
    locked: dict[int, int] = field(default_factory=dict)  # segment -> deepest block
    stopped: bool = False  # strict quota reached: register nothing more
    pending: tuple[int, int] | None = None  # (query tokens, hit tokens) of the last lookup
    # The sequence's full blocks so far, each cut and keyed once (`_extend_keys`): a
    # waiting sequence looked up on every step, or re-admitted after a preemption,
    # never hashes a block again. A block's tokens never change once it is full.
    chunks: list[Chunk] = field(default_factory=list)
    keys: list[BlockKey] = field(default_factory=list)


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
    ) -> None:
        self.pool = pool
        self.block_size = block_size
        self.index = index
        self.revision = revision
        self.policy = policy or CachePolicy()
        self.clock = clock
        self.ledger = EvictionLedger(pool.num_blocks, self.policy)
        self.lookup_work = 0  # probes or nodes visited by all lookups (for tests)
        self.keyed_blocks = 0  # block keys (hashes) computed, all sequences (for tests)
        self.query_tokens = 0
        self.hit_tokens = 0
        self._meta: dict[int, _Meta] = {}
        self._pinned: set[int] = set()
        self._seqs: dict[str, _SeqCache] = {}
        self._published: dict[tuple[int, ...], bytes] = {}
        self._keys: dict[tuple[str, str | None], CacheKey] = {}
        self._counters: dict[str, DomainCounters] = {}
        self._to_scrub: list[int] = []
        self._tick = 0

    @classmethod
    def from_config(cls, cache: CacheConfig, num_blocks: int, revision: str) -> KVCacheManager:
        """The manager `CacheConfig` describes, over a new pool of `num_blocks` blocks."""
        policy = CachePolicy(
            min_cached_blocks=cache.min_cached_blocks,
            min_cached_share=cache.min_cached_share,
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
        )
        for prefix in cache.published_prefixes:
            manager.publish_prefix(prefix)
        return manager

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

    # -- configuration ------------------------------------------------------------------

    def publish_prefix(self, token_ids: Seq[int]) -> int:
        """Shares the full blocks of `token_ids` with every domain; returns how many blocks."""
        # A request shares these blocks only if it starts with the whole sequence.
        n = len(token_ids) // self.block_size
        if n:
            full = tuple(int(t) for t in token_ids)
            self._published[full] = tokens_digest(full)
        return n

    def set_domain_floor(self, domain: str, blocks: int) -> None:
        """Overrides the cached blocks of `domain` that other domains cannot evict."""
        self.ledger.set_floor(domain, blocks)

    def set_domain_retention(self, domain: str, ttl_s: float | None) -> None:
        """Overrides how long idle cached blocks of `domain` are kept."""
        self.ledger.set_ttl(domain, ttl_s)

    # -- lookup -------------------------------------------------------------------------

    def _key(self, seq: Sequence) -> CacheKey:
        k = (seq.cache_domain, seq.adapter)
        key = self._keys.get(k)
        if key is None:
            key = self._keys[k] = CacheKey.derive(seq.cache_domain, seq.adapter, self.revision)
        return key

    def _plan(self, seq: Sequence) -> _SeqCache:
        key = self._key(seq)
        prompt = seq.prompt_token_ids
        best: tuple[int, ...] = ()
        for head in self._published:
            fits = len(best) < len(head) <= len(prompt)
            if fits and tuple(prompt[: len(head)]) == head:
                best = head
        if not best:
            return _SeqCache((_Segment(key.digest, seq.cache_domain, 0, None),))
        n = len(best) // self.block_size
        public = CacheKey.public(seq.adapter, self.revision)
        rest = key.continuation(self._published[best])
        return _SeqCache(
            (_Segment(public.digest, PUBLIC, 0, n), _Segment(rest, seq.cache_domain, n, None))
        )

    def _state(self, seq: Sequence) -> _SeqCache:
        st = self._seqs.get(seq.seq_id)
        if st is None:
            st = self._seqs[seq.seq_id] = self._plan(seq)
        return st

    def _extend_keys(self, seq: Sequence, st: _SeqCache, n: int) -> None:
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

    def _match(self, seq: Sequence, st: _SeqCache) -> list[int]:
        assert self.index is not None
        # Never the last token: at least one must be computed to get logits.
        max_blocks = (seq.num_tokens - 1) // self.block_size
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
        st.pending = (seq.num_tokens, len(found) * self.block_size)
        return found, len(found) * self.block_size

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
        own = len(seq.block_ids) + len(computed)
        if need > 0 and not self._make_room(need, seq.cache_domain, own):
            if computed:
                self._release(computed)
            return False
        seq.block_ids.extend(computed)
        if need > 0:
            seq.block_ids.extend(self.pool.allocate(need))
        if fresh and self.index is not None and seq.use_cache:
            self._adopted(seq, len(computed))
        return True

    def _adopted(self, seq: Sequence, n: int) -> None:
        assert self.index is not None
        st = self._state(seq)
        st.registered = n
        for i, seg in enumerate(st.segments):
            last = n if seg.end is None else min(seg.end, n)
            if last > seg.start:
                self.index.lock(seq.block_ids[last - 1])
                st.locked[i] = seq.block_ids[last - 1]
        if st.pending is not None:
            queried, hit = st.pending
            st.pending = None
            c = self._counters.setdefault(seq.cache_domain, DomainCounters())
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
            self._evict(victim)
        return True

    def _acquire(self, blocks: list[int]) -> None:
        for b in self.pool.incref(blocks):
            self.ledger.idle[self._meta[b].domain] -= 1
            self.ledger.drop_candidate(b)

    def _release(self, blocks: list[int]) -> None:
        now = self.clock()
        for b in self.pool.free(blocks):
            meta = self._meta.get(b)
            if meta is None:
                if self.policy.scrub_freed_blocks:
                    self._to_scrub.append(b)
                continue
            self._tick += 1
            meta.tick, meta.last_used = self._tick, now
            self.ledger.idle[meta.domain] += 1
            if meta.children == 0:
                self.ledger.add_candidate(b, meta.domain, meta.tick, now)

    def _evict(self, block_id: int) -> None:
        assert self.index is not None
        meta = self._meta.pop(block_id)
        self.index.remove(block_id)
        self.pool.evict(block_id)
        self.ledger.drop_candidate(block_id)
        self.ledger.cached[meta.domain] -= 1
        self.ledger.idle[meta.domain] -= 1
        self._counters.setdefault(meta.domain, DomainCounters()).evictions += 1
        if self.policy.scrub_freed_blocks:
            self._to_scrub.append(block_id)
        if meta.parent is not None:
            parent = self._meta[meta.parent]
            parent.children -= 1
            if parent.children == 0 and self.pool.is_idle(meta.parent):
                self.ledger.add_candidate(meta.parent, parent.domain, parent.tick, parent.last_used)

    def _expire(self) -> None:
        if self.policy.retention_ttl_s is None and not self.ledger._ttls:
            return
        now = self.clock()
        while expired := self.ledger.expired(now):
            for b in expired:
                self._evict(b)

    # -- after a step -------------------------------------------------------------------

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers the blocks of `seq` that are now full of computed tokens.

        A block whose prefix is already cached under another id is swapped for that
        one (identical contents), so every cached path a sequence uses is held by it.
        """
        if self.index is None or not seq.use_cache or not seq.block_ids:
            return
        st = self._state(seq)
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_ids))
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
                self._release([block])
            else:
                self._register(block, seg.domain, parent)
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
        self._evict(victim)
        return True

    def _register(self, block: int, domain: str, parent: int | None) -> None:
        self.pool.mark_cached(block)
        self._meta[block] = _Meta(domain, parent)
        if parent is not None:
            self._meta[parent].children += 1
            self.ledger.drop_candidate(parent)
        self.ledger.cached[domain] += 1
        if domain == PUBLIC:
            # Published prefixes are pinned: one extra reference, never released.
            self.pool.incref([block])
            self._pinned.add(block)

    def free(self, seq: Sequence, *, keep_keys: bool = False) -> None:
        """Releases the sequence's blocks; cached ones stay (idle) until evicted.

        `keep_keys` (a preempted sequence, which will be looked up again) keeps its
        plan and block keys, and nothing else.
        """
        st = self._seqs.pop(seq.seq_id, None)
        if st is not None and self.index is not None:
            for b in st.locked.values():
                self.index.unlock(b)
            if keep_keys:
                self._seqs[seq.seq_id] = _SeqCache(st.segments, chunks=st.chunks, keys=st.keys)
        if seq.block_ids:
            self._release(seq.block_ids)
            seq.block_ids = []

    def take_blocks_to_scrub(self) -> list[int]:
        """Blocks that left a domain since the last call (to be zeroed before reuse)."""
        out, self._to_scrub = self._to_scrub, []
        return out

    # -- introspection ------------------------------------------------------------------

    @property
    def num_pinned(self) -> int:
        """Blocks of published prefixes, held forever."""
        return len(self._pinned)

    def cached_block_ids(self) -> set[int]:
        """Every registered block."""
        return set(self._meta)

    def block_domain(self, block_id: int) -> str | None:
        """The domain a registered block belongs to (`eviction.PUBLIC` for published)."""
        meta = self._meta.get(block_id)
        return None if meta is None else meta.domain

    def domain_stats(self) -> dict[str, DomainCacheStats]:
        """Per-domain counters, with the number of blocks each domain has cached now."""
        domains = set(self._counters) | {d for d, n in self.ledger.cached.items() if n}
        out: dict[str, DomainCacheStats] = {}
        for d in sorted(domains):
            snap = self._counters.get(d, DomainCounters()).snapshot()
            out[d] = DomainCacheStats(
                snap.queries,
                snap.hits,
                snap.query_tokens,
                snap.cached_tokens,
                snap.evictions,
                self.ledger.cached[d],
            )
        return out

    def check_integrity(self) -> None:
        """Pool, index and ledger agree about every cached block."""
        self.pool.check_integrity()
        if self.index is None:
            return
        self.index.check_integrity()
        if len(self.index) != len(self._meta):
            raise AssertionError("index and manager disagree on the cached blocks")
        children: dict[int, int] = dict.fromkeys(self._meta, 0)
        idle: dict[str, int] = {}
        cached: dict[str, int] = {}
        for b, meta in self._meta.items():
            if not self.pool.is_cached(b):
                raise AssertionError(f"block {b} is registered but not flagged cached")
            if meta.parent is not None:
                children[meta.parent] += 1
            cached[meta.domain] = cached.get(meta.domain, 0) + 1
            if self.pool.is_idle(b):
                idle[meta.domain] = idle.get(meta.domain, 0) + 1
        for b, meta in self._meta.items():
            if children[b] != meta.children:
                raise AssertionError(f"block {b} child count is off")
            should = self.pool.is_idle(b) and meta.children == 0
            if should != self.ledger.is_candidate(b):
                raise AssertionError(f"block {b} candidate flag is off")
        if {d: n for d, n in self.ledger.idle.items() if n} != idle:
            raise AssertionError("idle counts are off")
        if {d: n for d, n in self.ledger.cached.items() if n} != cached:
            raise AssertionError("cached counts are off")
