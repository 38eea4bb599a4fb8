"""Building the prefix index a `prefix_cache` setting names.

Kept apart from the index contract (`prefix_index.py`) so that the indexes can import
the contract while this module imports the indexes, with no circle.
"""

from __future__ import annotations

from engine.kv_cache.hash_index import HashIndex
from engine.kv_cache.prefix_index import PrefixIndex
from engine.kv_cache.radix_index import RadixIndex


def make_prefix_index(mode: str, block_size: int) -> PrefixIndex | None:
    """The index for `prefix_cache="hash" | "radix" | "off"` (None for off)."""
    if mode == "off":
        return None
    if mode == "hash":
        return HashIndex(block_size)
    if mode == "radix":
        return RadixIndex(block_size)
    raise ValueError(f"unknown prefix_cache mode {mode!r}; use 'hash', 'radix' or 'off'")
