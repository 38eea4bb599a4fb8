"""Whether loading blocks from a lower tier pays, against recomputing them (seed §5.7).

A hit that is slower than recomputation degrades the service while every cache
metric looks healthy, so a lower-tier hit is taken only when

    blocks * bytes_per_block / copy bandwidth  <  blocks * block_size * prefill s/token

Both sides are measured by the engine: the bandwidth from its own tier copies (a
probe at start, then every executed batch of copies), the prefill cost from its
own steps (the wall time of steps that carry prompt tokens, per token scheduled;
the step's decodes are charged to the prompt too, which only makes recomputation
look dearer than it is by the decodes' share). Medians over a short window, so one
slow step moves little. Until the prefill cost is measured, loading is assumed to
pay: a copy is orders of magnitude cheaper than a forward pass on every machine
we run on, and the first measured step corrects it.
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 16
# Steps with fewer prompt tokens say little about the cost per token.
MIN_SAMPLE_TOKENS = 16


class LoadCostRule:
    """Measured copy bandwidth and prefill cost, and the decision between them."""

    def __init__(self, bytes_per_block: int, block_size: int) -> None:
        self.bytes_per_block = bytes_per_block
        self.block_size = block_size
        self._bandwidth: deque[float] = deque(maxlen=WINDOW)  # bytes per second
        self._per_token_s: deque[float] = deque(maxlen=WINDOW)

    def observe_copy(self, num_bytes: int, seconds: float) -> None:
        """One batch of tier copies moved `num_bytes` in `seconds`."""
        if num_bytes > 0 and seconds > 0:
            self._bandwidth.append(num_bytes / seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """One step computed `tokens` tokens (prompt chunks and decodes) in `seconds`."""
        if tokens >= MIN_SAMPLE_TOKENS and seconds > 0:
            self._per_token_s.append(seconds / tokens)

    def estimates(self) -> tuple[float | None, float | None]:
        """(copy bytes per second, prefill seconds per token); None until measured."""
        bw = statistics.median(self._bandwidth) if self._bandwidth else None
        per_token = statistics.median(self._per_token_s) if self._per_token_s else None
        return bw, per_token

    def load_s(self, num_blocks: int) -> float | None:
        """Predicted seconds to load `num_blocks` blocks (None: bandwidth not measured)."""
        bw, _ = self.estimates()
        return None if bw is None else num_blocks * self.bytes_per_block / bw

    def recompute_s(self, num_blocks: int) -> float | None:
        """Predicted seconds to recompute `num_blocks` blocks (None: not measured)."""
        _, per_token = self.estimates()
        return None if per_token is None else num_blocks * self.block_size * per_token

    def worth_loading(self, num_blocks: int) -> bool:
        """True when loading `num_blocks` blocks is predicted cheaper than recomputing."""
        load, recompute = self.load_s(num_blocks), self.recompute_s(num_blocks)
        if load is None or recompute is None:
            return True
        return load < recompute


class DiskLoadCost:
    """The same decision for the disk tier (L3): a block read from disk then goes up
    through a host slot, so its load costs the measured disk read (file read and
    digest check) plus the host tier's copy, against the host rule's prefill cost."""

    def __init__(self, host: LoadCostRule, payload_bytes: int) -> None:
        self.host = host
        self.payload_bytes = payload_bytes
        self._read_bw: deque[float] = deque(maxlen=WINDOW)  # bytes per second

    def observe_read(self, num_bytes: int, seconds: float) -> None:
        """One block file of `num_bytes` was read and checked in `seconds`."""
        if num_bytes > 0 and seconds > 0:
            self._read_bw.append(num_bytes / seconds)

    def read_bandwidth(self) -> float | None:
        """Median disk read bytes per second (None until measured)."""
        return statistics.median(self._read_bw) if self._read_bw else None

    def load_s(self, num_blocks: int) -> float | None:
        """Predicted seconds to bring `num_blocks` blocks from disk to the device."""
        bw = self.read_bandwidth()
        if bw is None:
            return None
        return num_blocks * self.payload_bytes / bw + (self.host.load_s(num_blocks) or 0.0)

    def worth_loading(self, num_blocks: int) -> bool:
        """True when reading `num_blocks` blocks is predicted cheaper than recomputing."""
        load, recompute = self.load_s(num_blocks), self.host.recompute_s(num_blocks)
        if load is None or recompute is None:
            return True
        return load < recompute
