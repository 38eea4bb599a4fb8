"""The token-weighted prefix-reuse fraction of a traffic sample, replayed in arrival order.

For each request, `shared` is its longest block-aligned prefix whose KV an earlier
request computed and which is still eligible in the same cache domain; the fraction
is the sum of `shared` over the sum of prompt tokens. Domains are the tenants (what
Cloister's isolation gives) or one shared domain (what it would be without
isolation: the difference is the cost of isolation). Eligibility can be limited to a
residency window (seconds since a block was last used) or to a KV budget (blocks
evicted least recently used first, across all domains, as the engine's pool does).

It is an overlap-only upper bound: no output tokens, no load, no preemption. The
replay through the real engine (`replay_on_engine`) gives the hit rate to hold it to.
Blocks are matched as the engine matches them: whole blocks only, and never the
prompt's last token, which must be computed to sample from it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequestError
from engine.kv_cache.cache_key import CacheKey, block_hash

SHARED_DOMAIN = "shared"  # the one domain of a replay without isolation
# The largest sample line taken; a prompt longer than this is not a chat request.
MAX_LINE_BYTES = 8 * 1024 * 1024


class TrafficSampleError(InvalidRequestError):
    """A line of the traffic sample is malformed; the message names the line."""

    code = "invalid_traffic_sample"


@dataclass(frozen=True)
class TrafficRecord:
    """One request of the sample: who sent it, when, and its prompt's token ids."""

    tenant: str
    timestamp: float
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReuseReport:
    """What a replay found, overall and per tenant (shared / prompt tokens)."""

    requests: int
    input_tokens: int
    shared_tokens: int
    per_tenant: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def reuse_fraction(self) -> float:
        """Token-weighted reuse: shared prompt tokens over all prompt tokens."""
        return self.shared_tokens / self.input_tokens if self.input_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "shared_tokens": self.shared_tokens,
            "reuse_fraction": self.reuse_fraction,
            "per_tenant": {
                t: {"shared_tokens": s, "input_tokens": n, "reuse_fraction": s / n if n else 0.0}
                for t, (s, n) in sorted(self.per_tenant.items())
            },
        }


def read_sample(path: Path, encode: Callable[[str], list[int]] | None) -> list[TrafficRecord]:
    """Reads a JSONL sample: `tenant`, `timestamp` (seconds or ISO 8601) and `token_ids` or
    `prompt` (text, tokenized with `encode`). Blank lines are skipped."""
    with path.open("rb") as f:
        return list(parse_sample(f, encode))


def parse_sample(
    lines: Iterable[bytes], encode: Callable[[str], list[int]] | None
) -> Iterator[TrafficRecord]:
    """The records of a JSONL sample's lines, checked one by one."""
    for number, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_BYTES:
            raise TrafficSampleError(f"line {number}: longer than {MAX_LINE_BYTES} bytes")
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TrafficSampleError(f"line {number}: not JSON ({exc})") from None
        if not isinstance(item, dict):
            raise TrafficSampleError(f"line {number}: a JSON object is expected")
        yield _record(item, number, encode)


def _record(
    item: dict[str, Any], number: int, encode: Callable[[str], list[int]] | None
) -> TrafficRecord:
    tenant = item.get("tenant")
    if not isinstance(tenant, str) or not tenant:
        raise TrafficSampleError(f"line {number}: 'tenant' must be a non-empty string")
    ids = item.get("token_ids")
    prompt = item.get("prompt")
    if ids is not None:
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
        ):
            raise TrafficSampleError(
                f"line {number}: 'token_ids' must be a list of non-negative integers"
            )
        tokens = tuple(ids)
    elif isinstance(prompt, str):
        if encode is None:
            raise TrafficSampleError(f"line {number}: a text prompt needs a model's tokenizer")
        tokens = tuple(encode(prompt))
    else:
        raise TrafficSampleError(f"line {number}: give 'token_ids' or a 'prompt' string")
    if not tokens:
        raise TrafficSampleError(f"line {number}: the prompt is empty")
    return TrafficRecord(tenant, _timestamp(item.get("timestamp"), number), tokens)


def _timestamp(value: object, number: int) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        stamp = float(value)
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise TrafficSampleError(
                f"line {number}: 'timestamp' {value!r} is not ISO 8601"
            ) from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=dt.UTC)
        stamp = parsed.timestamp()
    else:
        raise TrafficSampleError(f"line {number}: 'timestamp' must be seconds or ISO 8601")
    if stamp != stamp or stamp in (float("inf"), float("-inf")):
        raise TrafficSampleError(f"line {number}: 'timestamp' must be finite")
    return stamp


def replay_reuse(
    records: Sequence[TrafficRecord],
    *,
    block_size: int,
    isolated: bool = True,
    window_s: float | None = None,
    kv_budget_tokens: int | None = None,
) -> ReuseReport:
    """The upper bound: each request's eligible block-aligned prefix, in arrival order."""
    if block_size < 1:
        raise TrafficSampleError("the block size must be positive")
    if window_s is not None and not window_s > 0:
        raise TrafficSampleError("the residency window must be positive")
    capacity = None if kv_budget_tokens is None else kv_budget_tokens // block_size
    if capacity is not None and capacity < 1:
        raise TrafficSampleError("the KV budget holds no block")
    # (domain root, block hash) -> last use; the order is least recently used first.
    resident: OrderedDict[tuple[bytes, bytes], float] = OrderedDict()
    roots: dict[str, bytes] = {}
    per_tenant: dict[str, list[int]] = {}
    shared_total = input_total = 0
    for record in sorted(records, key=lambda r: r.timestamp):
        domain = record.tenant if isolated else SHARED_DOMAIN
        root = roots.get(domain)
        if root is None:
            root = roots[domain] = CacheKey.derive(domain, None, "replay").digest
        keys = _block_keys(root, record.token_ids, block_size)
        now = record.timestamp
        if window_s is not None:
            _expire(resident, now - window_s)
        matchable = (len(record.token_ids) - 1) // block_size
        hit = 0
        for key in keys[:matchable]:
            if (root, key) not in resident:
                break
            hit += 1
        for key in keys:
            resident[(root, key)] = now
            resident.move_to_end((root, key))
        if capacity is not None:
            while len(resident) > capacity:
                resident.popitem(last=False)
        shared = hit * block_size
        counts = per_tenant.setdefault(record.tenant, [0, 0])
        counts[0] += shared
        counts[1] += len(record.token_ids)
        shared_total += shared
        input_total += len(record.token_ids)
    return ReuseReport(
        requests=len(records),
        input_tokens=input_total,
        shared_tokens=shared_total,
        per_tenant={t: (s, n) for t, (s, n) in per_tenant.items()},
    )


def _block_keys(root: bytes, tokens: Sequence[int], block_size: int) -> list[bytes]:
    keys: list[bytes] = []
    parent = root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys


def _expire(resident: OrderedDict[tuple[bytes, bytes], float], oldest: float) -> None:
    while resident:
        key, last_use = next(iter(resident.items()))
        if last_use >= oldest:
            return
        del resident[key]
