"""The order in which a waiting queue admits what it holds, for tests of its policy."""

from __future__ import annotations

from engine.scheduler.queue import WaitingQueue
from engine.sequence import Sequence


def admission_order(queue: WaitingQueue) -> list[Sequence]:
    """Empties `queue` in the order it picks its sequences, charging each its prompt
    tokens as its first admission does, so that each pick sees the service given."""
    order: list[Sequence] = []
    while (seq := queue.peek()) is not None:
        queue.pop(seq)
        queue.charge(seq, seq.num_prompt_tokens)
        order.append(seq)
    return order
