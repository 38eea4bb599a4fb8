"""The published prefixes: token sequences whose full blocks every domain shares.

Two sources, kept apart because they change apart: those the engine was configured
with (`publish`, kept for the engine's life) and those of the registry's last push
(`replace_pushed`, replaced wholesale on each push). A request shares a published
prefix only when its prompt starts with the whole sequence; each prefix's digest
seeds the continuation key of the private blocks after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Sequence as Seq

from engine.kv_cache.cache_key import tokens_digest


class PublishedPrefixes:
    """The set of published prefixes now (configured and pushed), with their digests."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._configured: dict[tuple[int, ...], bytes] = {}
        self._pushed: dict[tuple[int, ...], bytes] = {}
        self._all: dict[tuple[int, ...], bytes] = {}

    def publish(self, token_ids: Seq[int]) -> int:
        """Adds a configured prefix; returns its full blocks (0: too short, not added)."""
        n = len(token_ids) // self.block_size
        if n:
            full = tuple(int(t) for t in token_ids)
            self._configured[full] = tokens_digest(full)
            self._all[full] = self._configured[full]
        return n

    def replace_pushed(self, prefixes: Iterable[tuple[int, ...]]) -> None:
        """The registry's push replaces the previous one (configured prefixes stay)."""
        self._pushed = {p: tokens_digest(p) for p in prefixes if len(p) >= self.block_size}
        self._all = {**self._configured, **self._pushed}

    def longest_prefix_of(self, prompt: Seq[int]) -> tuple[int, ...]:
        """The longest published prefix `prompt` starts with (() when none)."""
        best: tuple[int, ...] = ()
        for head in self._all:
            if len(best) < len(head) <= len(prompt) and tuple(prompt[: len(head)]) == head:
                best = head
        return best

    def digest(self, prefix: tuple[int, ...]) -> bytes:
        """The digest of a published prefix."""
        return self._all[prefix]

    def covers(self, prefix: tuple[int, ...], depth: int) -> bool:
        """Whether block `depth` of `prefix` lies within a prefix published now."""
        if prefix in self._all:
            return True
        # Another published prefix may share this block (one is a prefix of the other).
        end = (depth + 1) * self.block_size
        head = prefix[:end]
        return any(len(p) >= end and p[:end] == head for p in self._all)

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        """Every published prefix."""
        return iter(self._all)
