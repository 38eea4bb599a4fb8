"""The prefill tokens a step may carry, set from an inter-token-latency budget (seed §7).

A step's wall time is roughly a fixed part (the running decodes: one weight read,
attention, sampling) plus a cost per prefill token. Every running sequence waits
for the whole step before its next token, so the prefill a step carries is what
stretches inter-token latency. With a budget B, the next step's prefill is capped at

    (B - decode time) / cost per prefill token

from the engine's own recent steps (medians, so a slow first step or a noisy
neighbour moves the estimate little). Until both are measured the cap is the
scheduler's token budget. The cap never drops below what costs as much as the
decodes themselves (nor below `MIN_PREFILL_TOKENS`): when decodes alone fill the
budget, a step may at most double, and prompts still advance at half the
engine's time rather than starve.

The decode time is also kept per number of decode rows: a step's cost grows with
its rows (on a CPU, three rows can cost nearly twice one), and a busy spell's many
rows must not set the figure for a quieter one. A step's prompt tokens are charged
what is left after the decodes of its own rows, and the contended cap (below) is what
the decodes running now cost. During a flood of prompts no step is decode-only, so
a figure taken over all rows would keep the busiest spell's cost for as long as the
flood lasts, and the cap would stay that high.

The cap holds whether or not decodes are running. A burst of prompts arriving
together is then spread over several steps, so their sequences start and finish
at different steps and the next burst arrives spread out too. Without the cap,
a closed loop of clients stays in lock step: every prompt of a round waits for
one large prefill.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping

# Recent samples kept per estimate; the median of these is the estimate.
WINDOW = 16
# Fewer prefill tokens than this in a step say little about their cost: not sampled.
MIN_SAMPLE_TOKENS = 16
# The cap's floor: a prompt's share of a step when decodes alone take the budget.
MIN_PREFILL_TOKENS = 16


class StepBudget:
    """Learns step costs from observed steps and caps each step's prefill tokens."""

    def __init__(self, itl_budget_s: float | None, max_tokens: int) -> None:
        if itl_budget_s is not None and not itl_budget_s > 0:
            raise ValueError("the ITL budget must be positive")
        self.itl_budget_s = itl_budget_s
        self.max_tokens = max_tokens
        self._decode_s: deque[float] = deque(maxlen=WINDOW)
        # The same samples by decode rows (at most the scheduler's sequence limit).
        self._decode_by_rows: dict[int, deque[float]] = {}
        self._per_token_s: deque[float] = deque(maxlen=WINDOW)
        self._cap = max_tokens

    @property
    def enabled(self) -> bool:
        """Whether a budget is set (else the cap is always the scheduler's token budget)."""
        return self.itl_budget_s is not None

    def prefill_cap(self) -> int:
        """Prefill tokens the next step may carry (decode rows are never capped)."""
        return self._cap

    def contended_cap(self, decode_rows: int | None = None) -> int:
        """Prefill tokens the next step may carry while several tenants have work.

        As many as the running decodes (`decode_rows` of them; None: any number) cost
        (the floor of `prefill_cap`): each tenant's next token then waits for at most
        about one decode step of other tenants' prompts, which is what an even share of
        the engine's time gives it. Until both costs are measured (or without a budget),
        the usual cap.
        """
        if not self._decode_s or not self._per_token_s:
            return self._cap
        per_token = statistics.median(self._per_token_s)
        if per_token <= 0:
            return self._cap
        floor = max(MIN_PREFILL_TOKENS, int(self.decode_estimate(decode_rows) / per_token))
        return min(floor, self._cap)

    def observe(self, prefill_tokens: int, decode_rows: int, elapsed_s: float) -> None:
        """Records one finished step: its prefill tokens, decode rows and wall time."""
        if self.itl_budget_s is None or elapsed_s < 0:
            return
        if prefill_tokens == 0:
            if decode_rows > 0:
                self._decode_s.append(elapsed_s)
                by_rows = self._decode_by_rows.setdefault(decode_rows, deque(maxlen=WINDOW))
                by_rows.append(elapsed_s)
        elif prefill_tokens >= MIN_SAMPLE_TOKENS:
            # A step without decodes still pays the fixed part; without a decode figure
            # yet, the whole step is charged to its tokens (a smaller, safer cap).
            fixed = self.decode_estimate(decode_rows) if decode_rows > 0 else 0.0
            self._per_token_s.append(max(elapsed_s - fixed, 0.0) / prefill_tokens)
        self._cap = self._compute_cap()

    def estimates(self) -> tuple[float | None, float | None]:
        """(decode step seconds, seconds per prefill token), None where not yet measured."""
        decode = statistics.median(self._decode_s) if self._decode_s else None
        per_token = statistics.median(self._per_token_s) if self._per_token_s else None
        return decode, per_token

    def decode_estimate(self, rows: int | None = None) -> float:
        """The median decode step: of `rows` rows, or of the nearest number measured
        (the fewer on a tie); None or nothing measured by rows: of any number; 0.0
        before any decode-only step was measured."""
        if rows is not None and self._decode_by_rows:
            return statistics.median(self._decode_by_rows[_nearest(self._decode_by_rows, rows)])
        return statistics.median(self._decode_s) if self._decode_s else 0.0

    def extra_within(self, rows: int, slack: float) -> tuple[int, int] | None:
        """(decode rows, prompt tokens) a step may add beside `rows` decode rows and stay
        within (1 + slack) times their cost: from a line through the medians measured
        per number of rows, and the cost per prompt token. None until two row counts
        are measured; rows that cost nothing measurable are not limited."""
        line = self._row_line()
        if line is None:
            return None
        intercept, slope = line
        base = intercept + slope * rows
        room = slack * base
        if base <= 0 or room <= 0:
            return None
        per_token = statistics.median(self._per_token_s) if self._per_token_s else 0.0
        extra_rows = self.max_tokens if slope <= 0 else int(room / slope)
        extra_tokens = self.max_tokens if per_token <= 0 else int(room / per_token)
        return extra_rows, extra_tokens

    def marginal_costs(self) -> tuple[float, float] | None:
        """(seconds one more decode row adds to a step, seconds per prompt token), from
        the line through the medians per number of rows; None until two row counts and a
        prompt chunk are measured."""
        line = self._row_line()
        if line is None or not self._per_token_s:
            return None
        return line[1], statistics.median(self._per_token_s)

    def _row_line(self) -> tuple[float, float] | None:
        """(intercept, slope) of the least-squares line through the median decode step
        per number of rows; None until two row counts are measured."""
        points = [(r, statistics.median(ts)) for r, ts in self._decode_by_rows.items() if ts]
        if len(points) < 2:
            return None
        mean_r = statistics.fmean(r for r, _ in points)
        mean_t = statistics.fmean(t for _, t in points)
        spread = sum((r - mean_r) ** 2 for r, _ in points)
        slope = sum((r - mean_r) * (t - mean_t) for r, t in points) / spread
        return mean_t - slope * mean_r, slope

    def _compute_cap(self) -> int:
        assert self.itl_budget_s is not None
        if not self._per_token_s:
            return self.max_tokens
        per_token = statistics.median(self._per_token_s)
        if per_token <= 0:
            return self.max_tokens
        decode = self.decode_estimate()
        room = self.itl_budget_s - decode
        cap = int(room / per_token) if room > 0 else 0
        # Prompts may always take as much of a step as its decodes do: with more decodes
        # than the budget fits, a prompt still advances at half the engine's time.
        floor = max(MIN_PREFILL_TOKENS, int(decode / per_token))
        return min(max(cap, floor), self.max_tokens)


def _nearest(measured: Mapping[int, object], rows: int) -> int:
    """The measured number of rows closest to `rows` (the fewer on a tie)."""
    return min(measured, key=lambda r: (abs(r - rows), r))
