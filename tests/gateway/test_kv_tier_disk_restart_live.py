"""The disk KV tier (L3) across a restart, over HTTP: two `cloister serve` processes on
the tiny model, one after the other, on the same `kv_disk_path` (issue 41, item 4).

A device pool of 24 blocks of 16 tokens, a host tier (L2) of 2 blocks and a disk tier
of 256. First run: tenant A sends a 7-block prompt, then three long prompts of its own
that need most of the pool. They evict the first prompt's blocks through the host tier
down to disk; A's newer blocks then fill A's floor in the pool and its share of the host
tier. (A third tenant's flood would not do: the pool keeps a floor of each tenant's
blocks, so the first blocks of A's chain would stay in the device pool, which is never
written down at a stop, and a restart would find the rest of the chain without its
start.) The server is stopped cleanly, which finishes the disk writes. Second run, same
directory: the engine finds the files again; A's same prompt reports cached tokens,
loaded from disk, and tenant B's identical prompt none; the operators' /metrics show
the disk tier's loads and vLLM's external-cache hits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.kv_cache.host_setup import disk_file_bytes
from tests.gateway.processes import gateways, tenants_a_and_b
from tests.utils.openai_http import cached_tokens, post_ok
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

BLOCK = 16
POOL_BLOCKS = 24
BYTES_PER_BLOCK = 2 * 2 * BLOCK * 2 * 16 * 4  # K and V, 2 layers, 2 kv heads of 16, fp32
DISK_BLOCKS = 256


def _text(tag: str, n: int) -> str:
    """`n` words no other prompt here starts with (so no two prompts share a block)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def _complete(base_url: str, key: str, prompt: str) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    return post_ok(base_url, "/v1/completions", key, body)


def test_a_tenants_blocks_on_disk_survive_a_restart_for_that_tenant_only(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    key_a, key_b, admin = tenants_a_and_b(data_dir)
    model = make_tiny_model_dir(tmp_path / "model")
    disk = tmp_path / "l3"
    config = {
        "kv_cache_bytes": POOL_BLOCKS * BYTES_PER_BLOCK,
        "kv_host_bytes": 2 * BYTES_PER_BLOCK,
        "kv_disk_path": disk,
        "kv_disk_bytes": DISK_BLOCKS * disk_file_bytes(BYTES_PER_BLOCK, BLOCK),
        "block_size": BLOCK,
        "max_model_len": 400,
    }
    prompt = _text("alpha", 42)  # about 120 tokens
    with gateways(data_dir, model, tmp_path / "logs-1", [config]) as (gw,):
        assert "disk KV tier in" in gw.logs() and "0 found from a previous run" in gw.logs()
        first = _complete(gw.base_url, key_a, prompt)
        prompt_tokens = first["usage"]["prompt_tokens"]
        assert prompt_tokens > 6 * BLOCK and cached_tokens(first) == 0
        for tag in ("kilo", "mike", "zulu"):  # A's own later work pushes the first down
            flood = _complete(gw.base_url, key_a, _text(tag, 75))
            assert flood["usage"]["prompt_tokens"] > (POOL_BLOCKS - 8) * BLOCK
    assert any(disk.iterdir()), "nothing was written to the disk tier"

    with gateways(data_dir, model, tmp_path / "logs-2", [config]) as (gw,):
        found = re.search(r"(\d+) found from a previous run", gw.logs())
        assert found is not None and int(found.group(1)) > 0, gw.logs()[-2000:]
        # The other tenant first: its identical prompt finds nothing of A's on disk.
        assert cached_tokens(_complete(gw.base_url, key_b, prompt)) == 0
        again = _complete(gw.base_url, key_a, prompt)
        # The device pool and host memory started empty: these came from the disk tier.
        assert 0 < cached_tokens(again) <= prompt_tokens, again["usage"]
        assert cached_tokens(again) >= 4 * BLOCK, again["usage"]
        # The operators' /metrics: the disk tier's loads, and vLLM's external-cache hits
        # in tokens, which are exactly what A was served (the restarted pool held none).
        metrics = httpx.get(
            gw.base_url + "/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=30
        ).text
        assert _sample(metrics, 'cloister:kv_tier_loads_total{model_name="tiny",tier="DISK"}') > 0
        hits = _sample(metrics, 'vllm:external_prefix_cache_hits_total{model_name="tiny"}')
        assert hits == cached_tokens(again)


def _sample(text: str, series: str) -> float:
    """The value of one exact series (name and labels) in an exposition text."""
    (line,) = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    return float(line.rsplit(" ", 1)[1])
