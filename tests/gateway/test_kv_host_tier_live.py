"""The host KV tier (L2) over HTTP: a real `cloister serve` process on the tiny model.

A device pool of 24 blocks of 16 tokens. Tenant A has one conversation turn cached;
tenant B then floods the pool with prompts of its own, which evicts A's blocks (all but
A's fair floor of 2 blocks) and so writes them down to the host tier. A's next turn
still reports most of its first turn as `cached_tokens` (loaded back from L2); B, sending
A's very turn, gets none of it. The operators' /metrics show the tier's loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.processes import gateways, tenants_a_and_b
from tests.utils.openai_http import cached_tokens, post_ok
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

BLOCK = 16
POOL_BLOCKS = 24
BYTES_PER_BLOCK = 2 * 2 * BLOCK * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads of 16, fp32
FLOOR_TOKENS = 2 * BLOCK  # fair_cached_share 0.2 of 24 blocks over 2 tenants: 2 blocks each


def _words(seed: int, n: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(n))


def _chat(base_url: str, key: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}
    return post_ok(base_url, "/v1/chat/completions", key, body)


def test_an_evicted_turn_comes_back_from_l2_and_only_to_its_tenant(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    key_a, key_b, admin = tenants_a_and_b(data_dir)
    model = make_tiny_model_dir(tmp_path / "model")
    config = {
        "kv_cache_bytes": POOL_BLOCKS * BYTES_PER_BLOCK,
        "kv_host_bytes": 256 * BYTES_PER_BLOCK,
        "block_size": BLOCK,
        "max_model_len": 320,
        "fair_cached_share": 0.2,
    }
    with gateways(data_dir, model, tmp_path / "logs", [config]) as (gw,):
        assert "host KV tier: 256 blocks" in gw.logs()
        turn1 = [{"role": "user", "content": _words(1, 30)}]
        first = _chat(gw.base_url, key_a, turn1)
        prompt1 = first["usage"]["prompt_tokens"]
        assert prompt1 > 6 * BLOCK and cached_tokens(first) == 0
        # B's flood: distinct prompts, each most of the pool.
        flood = [
            _chat(gw.base_url, key_b, [{"role": "user", "content": _words(i, 36)}])
            for i in range(2, 6)
        ]
        # What B finds of its own: the chat template's opening, common to all its prompts.
        own_opening = cached_tokens(flood[-1])
        assert own_opening < 2 * BLOCK
        reply = first["choices"][0]["message"]["content"]
        turn2 = [
            *turn1,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "and then?"},
        ]
        # The flooding tenant sends A's very turn: nothing of A's, in the pool or in L2
        # (only the template opening it cached itself).
        assert cached_tokens(_chat(gw.base_url, key_b, turn2)) == own_opening
        second = _chat(gw.base_url, key_a, turn2)
        # More than the floor kept in the pool: the rest came back from the host tier.
        assert cached_tokens(second) > FLOOR_TOKENS + 2 * BLOCK, second["usage"]
        assert cached_tokens(second) <= prompt1
        metrics = httpx.get(
            gw.base_url + "/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=30
        ).text
        loads = [
            line
            for line in metrics.splitlines()
            if line.startswith("cloister:kv_tier_loads_total{")
        ]
        assert loads and float(loads[0].rsplit(" ", 1)[1]) > 0, loads
        anonymous = httpx.get(gw.base_url + "/metrics", timeout=30).text
        assert "cloister:kv_tier" not in anonymous
