"""One step's prompt tokens shared among tenants while several have work.

The ITL budget caps the prompt tokens of each step (step_budget.py), and running
sequences are scheduled before waiting ones. So a tenant that keeps long prompts in
flight (a flood of long one-token prompts) spent the whole cap on its prompt chunks
step after step, and every step another tenant's tokens waited for was as long as
the budget allows: that tenant's time to first token and between tokens grew with
the attacker's prompts. While more than one tenant has work (running or waiting),
each step carries at most the contended cap of prompt tokens (about what the step's
decodes cost, `StepBudget.contended_cap`), split among them by weight; a tenant's
running chunks and its admissions alike take from its own part. A tenant alone keeps
the whole cap.

A tenant that streams one request after another has no work for the moment between
them, and the step that starts then would carry a whole cap of the other tenant's
prompts, which its next request waits behind. So a tenant keeps its part for
`GRACE_STEPS` steps after its last sequence ended.

A request's first chunk is what its time to first token waits for. While a tenant with
nothing running has a new request waiting, the step carries no prompt chunk of
another tenant that had one in the step before (`Scheduler._newcomers`): the
newcomer's step is as short as the decodes let it be, and every tenant's prompts
still advance at least every other step however many newcomers arrive. The running
sequences of tenants served as much or more sit that step out too (a step's cost grows
with its rows), but never two steps running, and not while the pool has no free block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.scheduler.step_budget import MIN_PREFILL_TOKENS
from engine.sequence import Sequence

# Steps a tenant keeps its part of the prompt tokens after its work ended: longer than
# the gap between a client's reply and its next request on either device.
GRACE_STEPS = 4


class PrefillShares:
    """Per tenant, what is left of its part of this step's prompt-token cap."""

    def __init__(self, cap: int, keys: Iterable[str], weight: Callable[[str], float]) -> None:
        keys = set(keys)
        self._left: dict[str, int] | None = None
        if len(keys) > 1:
            weights = {k: weight(k) for k in keys}
            total = sum(weights.values())
            # A part is never below half the step budget's floor: a few tokens a step
            # would make a short prompt (or the block a fully cached one recomputes) take
            # many steps, and seats would go to whichever tenant's prompts were cached first.
            floor = min(cap, MIN_PREFILL_TOKENS // 2)
            self._left = {k: max(floor, int(cap * w / total)) for k, w in weights.items()}

    def hold(self, keys: Iterable[str]) -> None:
        """`keys` get no prompt tokens this step."""
        if self._left is not None:
            for key in keys:
                if key in self._left:
                    self._left[key] = 0

    def cap(self, key: str, tokens: int) -> int:
        """`tokens` of a prompt chunk of `key`, cut to what is left of its part."""
        if self._left is None:
            return tokens
        return min(tokens, self._left.get(key, tokens))

    def spend(self, key: str, tokens: int) -> None:
        """A prompt chunk of `key` of `tokens` was scheduled."""
        if self._left is not None and key in self._left:
            self._left[key] = max(0, self._left[key] - tokens)


class PrefillSplit:
    """Across steps: the tenants that have work, or had it in the last `grace` steps."""

    def __init__(self, grace_steps: int = GRACE_STEPS) -> None:
        self.grace_steps = grace_steps
        self._recent: dict[str, int] = {}  # key -> steps it keeps its part

    def clear(self) -> None:
        """The engine went idle: no client gap is left to bridge (grace is counted in
        steps, and an idle engine takes none)."""
        self._recent.clear()

    def shares(
        self,
        cap: int,
        running: Iterable[Sequence],
        waiting_keys: Iterable[str],
        weight: Callable[[str], float],
    ) -> PrefillShares:
        """This step's parts of `cap` prompt tokens. Every tenant with work counts,
        whether or not its running sequences are in a prompt now: how far a prompt got
        depends on what the cache served, the split must not."""
        active = {s.fairness_key for s in running}
        active.update(waiting_keys)
        for key, left in list(self._recent.items()):
            if key in active:
                continue
            if left <= 0:
                del self._recent[key]
            else:
                self._recent[key] = left - 1
        for key in active:
            self._recent[key] = self.grace_steps
        return PrefillShares(cap, self._recent, weight)
