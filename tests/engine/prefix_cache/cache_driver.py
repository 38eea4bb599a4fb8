"""A fake model over a fake KV store, driving the real Scheduler and KVCacheManager.

The fake model reads its history back from the blocks of the block table, so a
sequence that adopts a block with the wrong contents samples different tokens:
a cache bug shows up as an output mismatch, exactly as it would on a real model.
The driver also records who wrote each block, to check isolation at admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.eviction import PUBLIC, CachePolicy
from engine.kv_cache.index_factory import make_prefix_index
from engine.kv_cache.manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler.output import SchedulerOutput
from engine.scheduler.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from tests.utils.engine_requests import make_sequence
from tests.utils.kv_inspect import block_domain, cached_block_ids, ref_count

# (domain or PUBLIC, adapter, prefix tokens, the published prefix a domain's chain follows)
Identity = tuple[str, str | None, tuple[int, ...], tuple[int, ...]]


def fake_next_token(history: list[int]) -> int:
    """A pure function of the (read-back) history."""
    return (sum(t * (i + 7) for i, t in enumerate(history)) + len(history)) % 997


class FakeClock:
    """A clock tests advance by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class CacheDriver:
    """schedule -> fake forward over the fake KV store -> update, with isolation checks."""

    scheduler: Scheduler
    kv: KVCacheManager
    clock: FakeClock
    published: list[tuple[int, ...]] = field(default_factory=list)
    seqs: list[Sequence] = field(default_factory=list)
    store: dict[int, list[int]] = field(default_factory=dict)
    identity: dict[int, Identity] = field(default_factory=dict)
    check_hits: bool = True
    hit_log: list[tuple[str, int]] = field(default_factory=list)
    # The published prefix each sequence's last lookup planned with: the published set
    # may change while it runs (`apply_rules`), its chain does not.
    plans: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def make(
        cls,
        mode: str = "hash",
        *,
        num_blocks: int = 64,
        block_size: int = 4,
        policy: CachePolicy | None = None,
        published: tuple[tuple[int, ...], ...] = (),
        **sched: object,
    ) -> CacheDriver:
        clock = FakeClock()
        kv = KVCacheManager(
            BlockPool(num_blocks),
            block_size,
            index=make_prefix_index(mode, block_size),
            revision="rev",
            policy=policy,
            clock=clock,
        )
        for p in published:
            kv.publish_prefix(p)
        cfg = SchedulerConfig(**sched)  # type: ignore[arg-type]
        scheduler = Scheduler(cfg, kv, eos_token_ids=frozenset(), max_model_len=10_000)
        driver = cls(scheduler, kv, clock, published=[p for p in published])
        original = kv.get_computed_blocks

        def checked(seq: Sequence) -> tuple[list[int], int]:
            driver.plans[seq.seq_id] = driver._best(seq)
            blocks, n = original(seq)
            # After the lookup, which drops expired blocks before matching.
            expected = driver.expected_hit(seq)
            driver.hit_log.append((seq.seq_id, n))
            if driver.check_hits:
                assert n == expected, (seq.seq_id, n, expected)
            return blocks, n

        kv.get_computed_blocks = checked  # type: ignore[method-assign]
        return driver

    def add(
        self,
        prompt: list[int],
        max_tokens: int,
        domain: str = "a",
        *,
        adapter: str | None = None,
        use_cache: bool = True,
        fairness_key: str = "",
        batch: bool = False,
    ) -> Sequence:
        seq_id = f"r{len(self.seqs)}"
        seq = make_sequence(
            seq_id=seq_id,
            request_id=seq_id,
            index=0,
            prompt_token_ids=list(prompt),
            params=SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
            max_tokens=max_tokens,
            cache_domain=domain,
            adapter=adapter,
            use_cache=use_cache,
            fairness_key=fairness_key,
            batch=batch,
        )
        self.seqs.append(seq)
        self.scheduler.add(seq)
        return seq

    # -- the reference model of what must be hit --------------------------------------

    def _best(self, seq: Sequence) -> tuple[int, ...]:
        """The longest published prefix (of at least one block) the prompt starts with."""
        best: tuple[int, ...] = ()
        for p in self.published:
            fits = len(best) < len(p) <= seq.num_prompt_tokens and len(p) >= self.kv.block_size
            if fits and tuple(seq.prompt_token_ids[: len(p)]) == p:
                best = tuple(p)
        return best

    def block_identity(self, seq: Sequence, i: int) -> Identity:
        bs = self.kv.block_size
        best = self.plans.get(seq.seq_id)
        if best is None:
            best = self._best(seq)
        tokens = tuple(seq.token_ids(0, (i + 1) * bs))
        if i < len(best) // bs:
            return PUBLIC, seq.adapter, tokens, ()  # one public chain per adapter
        return seq.cache_domain, seq.adapter, tokens, best

    def expected_hit(self, seq: Sequence) -> int:
        """Tokens that must be hit: every cached block of this key's prefix, in order."""
        if not seq.use_cache:
            return 0
        cached = {self.identity[b] for b in cached_block_ids(self.kv)}
        n = 0
        while n < (seq.num_tokens - 1) // self.kv.block_size:
            if self.block_identity(seq, n) not in cached:
                break
            n += 1
        return n * self.kv.block_size

    # -- steps ------------------------------------------------------------------------

    def step(self) -> SchedulerOutput:
        before = {s.seq_id for s in self.scheduler.running}
        out = self.scheduler.schedule()
        bs = self.kv.block_size
        sampled: dict[str, int] = {}
        for item in out.scheduled:
            seq = item.seq
            if seq.seq_id not in before:
                self._check_adopted(seq, item.start)
            for p in range(item.start, item.end):
                block = seq.block_ids[p // bs]
                self.store.setdefault(block, [-1] * bs)[p % bs] = seq.token_ids(p, p + 1)[0]
                if p % bs == bs - 1:
                    self.identity[block] = self.block_identity(seq, p // bs)
            if item.samples:
                history = [self.store[seq.block_ids[p // bs]][p % bs] for p in range(item.end)]
                sampled[seq.seq_id] = fake_next_token(history)
        self.scheduler.update(out, sampled)
        self.clock.now += 1.0
        return out

    def _check_adopted(self, seq: Sequence, start: int) -> None:
        """Adopted blocks were computed for this key (or published), with these tokens."""
        bs = self.kv.block_size
        for i in range(start // bs):
            block = seq.block_ids[i]
            assert self.identity[block] == self.block_identity(seq, i), (seq.seq_id, i)
            assert self.store[block] == seq.token_ids(i * bs, (i + 1) * bs)

    def run(self, max_steps: int = 20_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished():
                return
            self.step()
        raise AssertionError("scheduler did not finish")

    def assert_clean(self) -> None:
        """Reference counts back to zero (published blocks keep their pin); no block lost."""
        self.kv.check_integrity()
        pool = self.kv.pool
        assert all(s.status is SequenceStatus.FINISHED and not s.block_ids for s in self.seqs)
        for b in range(pool.num_blocks):
            expected = 1 if block_domain(self.kv, b) == PUBLIC else 0
            assert ref_count(pool, b) == expected, b
        assert pool.num_free + self.kv.num_pinned == pool.num_blocks
