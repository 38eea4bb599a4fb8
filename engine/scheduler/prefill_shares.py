"""One step's prompt tokens shared among tenants while several have work.

The ITL budget caps the prompt tokens of each step (step_budget.py), and running
sequences are scheduled before waiting ones. So a tenant that keeps long prompts in
flight (a flood of long one-token prompts) spent the whole cap on its running prompt
chunks step after step, and another tenant's short prompt could not start until they
were done: its time to first token grew with the attacker's prompt lengths. While
more than one tenant has work (running or waiting), each one's running prompt chunks
get at most its weighted part of the cap; what they leave is there for admissions,
which the fair queue orders. A tenant alone keeps the whole cap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.sequence import Sequence


class PrefillShares:
    """Per tenant, what is left of its part of this step's prompt-token cap."""

    def __init__(
        self,
        cap: int,
        running: Iterable[Sequence],
        waiting_keys: Iterable[str],
        weight: Callable[[str], float],
    ) -> None:
        # Every tenant with work, whether or not its running sequences are in a prompt
        # now: how far a prompt got depends on what the cache served, the split must not.
        keys = {s.fairness_key for s in running}
        keys.update(waiting_keys)
        self._left: dict[str, int] | None = None
        if len(keys) > 1:
            weights = {k: weight(k) for k in keys}
            total = sum(weights.values())
            self._left = {k: max(1, int(cap * w / total)) for k, w in weights.items()}

    def cap(self, key: str, tokens: int) -> int:
        """`tokens` of a running prompt chunk of `key`, cut to what is left of its part."""
        if self._left is None:
            return tokens
        return min(tokens, self._left.get(key, tokens))

    def spend(self, key: str, tokens: int) -> None:
        """`key`'s running prompt chunk of `tokens` was scheduled."""
        if self._left is not None and key in self._left:
            self._left[key] = max(0, self._left[key] - tokens)
