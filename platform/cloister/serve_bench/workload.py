"""What the benchmark sends: the serving guide's workload matrix, as token-id prompts.

A cell of the matrix fixes the prompt length, the output length, the share of the
prompt that is a prefix common to a tenant's requests, and the number of turns per
conversation (each turn's prompt is the previous prompt, a stand-in for its answer
and a new user turn, as a chat history grows). Tenants are the API keys given: each
has its own common prefix, so with per-tenant isolation they never share it.
Prompts are random token ids from a seeded generator: the same seed gives the same
requests to every server compared.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

# Ids below this are special tokens in most vocabularies; random prompts avoid them.
FIRST_PLAIN_ID = 100


@dataclass(frozen=True)
class WorkloadCell:
    """One point of the workload matrix."""

    input_len: int
    output_len: int
    prefix_share: float  # of input_len, common to one tenant's requests
    turns: int  # per conversation; 1 is single-shot

    @property
    def name(self) -> str:
        """A short label for tables and plots."""
        return (
            f"in{self.input_len}-out{self.output_len}-"
            f"prefix{round(self.prefix_share * 100)}-turns{self.turns}"
        )


@dataclass(frozen=True)
class PlannedRequest:
    """One request to send: whose key, its prompt ids and its output budget."""

    tenant: int
    prompt: tuple[int, ...]
    max_tokens: int


def matrix(
    input_lens: Sequence[int],
    output_lens: Sequence[int],
    prefix_shares: Sequence[float],
    turns: Sequence[int],
) -> list[WorkloadCell]:
    """Every combination of the given values (the cartesian product)."""
    return [
        WorkloadCell(i, o, p, t)
        for i, o, p, t in itertools.product(input_lens, output_lens, prefix_shares, turns)
    ]


def tenant_prefixes(cell: WorkloadCell, tenants: int, vocab: int, seed: int) -> list[list[int]]:
    """Each tenant's common prefix (the same for every worker of one run)."""
    rng = random.Random(f"{seed}/prefixes")
    length = int(cell.input_len * cell.prefix_share)
    return [_random_ids(rng, length, vocab) for _ in range(tenants)]


def _random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_PLAIN_ID, vocab) for _ in range(n)]


class Conversations:
    """One simulated user (a worker thread): its conversations, one turn after another.

    A turn is sent only once the previous one has been answered (the worker is a
    closed loop), so a later turn can find its history in the cache, as in a chat.
    Conversation k of worker w belongs to tenant (w + k * workers) mod tenants.
    """

    def __init__(
        self,
        cell: WorkloadCell,
        prefixes: Sequence[Sequence[int]],
        *,
        vocab: int,
        seed: int,
        worker: int,
        workers: int,
    ) -> None:
        self._cell, self._prefixes, self._vocab = cell, prefixes, vocab
        self._worker, self._workers = worker, workers
        self._rng = random.Random(f"{seed}/worker{worker}")
        self._requests: Iterator[PlannedRequest] = self._generate()

    def _generate(self) -> Iterator[PlannedRequest]:
        cell, rng = self._cell, self._rng
        turn_len = max(1, cell.input_len - len(self._prefixes[0]))
        for k in itertools.count():
            tenant = (self._worker + k * self._workers) % len(self._prefixes)
            history = [*self._prefixes[tenant], *_random_ids(rng, turn_len, self._vocab)]
            for _ in range(cell.turns):
                yield PlannedRequest(tenant, tuple(history), cell.output_len)
                # The next turn: this prompt, an answer-sized stand-in, a new user turn.
                history += _random_ids(rng, cell.output_len, self._vocab)
                history += _random_ids(rng, turn_len, self._vocab)

    def next(self) -> PlannedRequest:
        """The next request this user sends."""
        return next(self._requests)
