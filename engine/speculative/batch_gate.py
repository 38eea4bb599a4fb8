"""Whether a step speculates at all, by how many sequences decode in it.

Verifying k drafts costs little more than one token while a step is bound by
reading the weights; as the batch grows the step becomes bound by compute and
the extra rows cost their full price. Where that happens depends on the model
and the device, so it is measured: per batch-size bucket (1, 2-3, 4-7, ...) the
gate keeps the tokens per second of decode steps with drafts and without, and
speculates where drafts pay, trying the other arm now and then so that a
changed workload is noticed. An operator's `speculative_max_batch` replaces the
measurement with a fixed bound.
"""

from __future__ import annotations

from dataclasses import dataclass

# Steps of each arm a bucket measures before it trusts the comparison.
MIN_SAMPLES = 3
# One step in this many takes the losing arm, to keep its figure current.
EXPLORE_EVERY = 25
EMA_WEIGHT = 0.2


@dataclass
class _Arm:
    # Averaged tokens and seconds per step: their ratio is the arm's throughput. (An
    # average of per-step rates would favour drafting: its short steps without drafts
    # and its long ones with many tokens both look fast one by one.)
    tokens: float = 0.0
    seconds: float = 0.0
    samples: int = 0

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def add(self, tokens: int, seconds: float) -> None:
        if self.samples == 0:
            self.tokens, self.seconds = float(tokens), seconds
        else:
            self.tokens += EMA_WEIGHT * (tokens - self.tokens)
            self.seconds += EMA_WEIGHT * (seconds - self.seconds)
        self.samples += 1


@dataclass
class _Bucket:
    spec: _Arm
    plain: _Arm
    steps: int = 0


class BatchGate:
    """Decides per step whether drafts are proposed, from measured step throughput."""

    def __init__(self, max_batch: int | None) -> None:
        self.max_batch = max_batch
        self._buckets: dict[int, _Bucket] = {}

    def allows(self, rows: int) -> bool:
        """Whether a step with `rows` decoding sequences may carry drafts."""
        if rows <= 0:
            return False
        if self.max_batch is not None:
            return rows <= self.max_batch
        bucket = self._bucket(rows)
        bucket.steps += 1
        spec, plain = bucket.spec, bucket.plain
        if spec.samples < MIN_SAMPLES or plain.samples < MIN_SAMPLES:
            return spec.samples <= plain.samples
        better = spec.rate >= plain.rate
        return not better if bucket.steps % EXPLORE_EVERY == 0 else better

    def observe(self, rows: int, drafted: bool, tokens: int, elapsed_s: float) -> None:
        """One finished decode-only step: its rows, whether the gate let it draft, the
        tokens it emitted and its wall time."""
        if self.max_batch is not None or rows <= 0 or elapsed_s <= 0:
            return
        bucket = self._bucket(rows)
        (bucket.spec if drafted else bucket.plain).add(tokens, elapsed_s)

    def pays(self, rows: int) -> bool | None:
        """Whether drafts measured faster at this batch size (None: not measured yet)."""
        bucket = self._buckets.get(rows.bit_length())
        if bucket is None or min(bucket.spec.samples, bucket.plain.samples) < MIN_SAMPLES:
            return None
        return bucket.spec.rate >= bucket.plain.rate

    def _bucket(self, rows: int) -> _Bucket:
        key = rows.bit_length()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(_Arm(), _Arm())
        return bucket
