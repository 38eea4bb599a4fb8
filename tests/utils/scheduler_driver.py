"""Drives the real Scheduler with a fake, deterministic 'model' (no tensors), for fast tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.kv_cache.block_pool import BlockPool
from engine.kv_cache.manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler.output import SchedulerOutput
from engine.scheduler.scheduler import Scheduler
from engine.sequence import Sequence
from tests.utils.engine_requests import make_sequence

VOCAB = 1000
EOS = 999


def next_token(history: list[int]) -> int:
    """A pure function of the whole history, so recompute after preemption gives the same token."""
    return (sum(history) * 31 + len(history)) % (VOCAB - 1)


@dataclass
class Driver:
    """Runs schedule -> fake sample -> update until every sequence finishes."""

    scheduler: Scheduler
    steps: list[SchedulerOutput] = field(default_factory=list)
    seqs: list[Sequence] = field(default_factory=list)

    @classmethod
    def make(
        cls, *, num_blocks: int, block_size: int = 4, window: int | None = None, **sched: float
    ) -> Driver:
        """`window`: the model's window on every layer (blocks behind it are released)."""
        kv = KVCacheManager(BlockPool(num_blocks), block_size, window=window)
        cfg = SchedulerConfig(**sched)  # type: ignore[arg-type]
        return cls(Scheduler(cfg, kv, eos_token_ids=frozenset({EOS}), max_model_len=10_000))

    def add(
        self,
        prompt: list[int],
        max_tokens: int,
        seq_id: str | None = None,
        domain: str = "d",
        batch: bool = False,
    ) -> Sequence:
        seq_id = seq_id or f"r{len(self.seqs)}"
        seq = make_sequence(
            seq_id=seq_id,
            request_id=seq_id,
            index=0,
            prompt_token_ids=prompt,
            params=SamplingParams(max_tokens=max_tokens, temperature=0),
            max_tokens=max_tokens,
            cache_domain=domain,
            batch=batch,
        )
        self.seqs.append(seq)
        self.scheduler.add(seq)
        return seq

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.steps.append(out)
        sampled = {
            item.seq.seq_id: next_token(item.seq.all_token_ids)
            for item in out.scheduled
            if item.samples
        }
        self.scheduler.update(out, sampled)
        return out

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished():
                return
            self.step()
        raise AssertionError("scheduler did not finish")
