"""The engine set-up the disk-tier (L3) tests share: a pool of 12 blocks of 8 tokens, a
58-token prompt of tenant a (7 full blocks), floods that evict it, and an engine with a
host tier (L2) of one block by default over a disk tier in a temporary directory. The
`tiny_model` and `block_bytes` fixtures are in this folder's conftest.py."""

from __future__ import annotations

import pathlib
from typing import cast

from engine import LLM, SamplingParams
from engine.kv_cache.disk_format import parse_header
from engine.kv_cache.disk_tier import DiskTier
from engine.kv_cache.host_setup import disk_file_bytes
from engine.kv_cache.host_tier import HostTier
from engine.outputs import RequestOutput

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=5)
PROMPT_A = list(range(10, 68))  # 58 tokens: 7 full blocks, the last token computed
FLOOD_B = list(range(100, 180))  # 80 tokens: needs most of the pool
FLOOD_2 = list(range(200, 280))
BLOCK = 8


def with_l3(
    model: pathlib.Path,
    path: pathlib.Path,
    block_bytes: int,
    *,
    host_blocks: int = 1,
    disk_blocks: int = 64,
    **options: object,
) -> LLM:
    opts: dict[str, object] = {
        "num_blocks": 12,
        "block_size": BLOCK,
        # One host slot by default: evictions go on down to disk at once.
        "kv_host_bytes": host_blocks * block_bytes,
        "kv_disk_path": str(path),
        "kv_disk_bytes": disk_blocks * disk_file_bytes(block_bytes, BLOCK),
    }
    opts.update(options)
    return LLM(str(model), **opts)


def host_of(llm: LLM) -> HostTier:
    return cast(HostTier, llm.engine.kv.tier)


def disk_of(llm: LLM) -> DiskTier:
    disk = host_of(llm).lower
    assert disk is not None
    return disk


def settle(llm: LLM) -> None:
    """Waits for the disk tier's background writes and deletes."""
    disk_of(llm).files.flush()


def block_files(path: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".kvb"))


def files_by_block(
    llm: LLM, path: pathlib.Path, prompt: list[int], domain: str = "t:a"
) -> dict[int, pathlib.Path]:
    """Which block of `prompt` each file of `domain` holds (by its header)."""
    chunks = {tuple(prompt[i * BLOCK : (i + 1) * BLOCK]): i for i in range(len(prompt) // BLOCK)}
    out: dict[int, pathlib.Path] = {}
    for f in block_files(path):
        record, _, _ = parse_header(f.read_bytes(), disk_of(llm).files.fingerprint)
        if record.chunk in chunks and record.domain == domain:
            out[chunks[record.chunk]] = f
    return out


def run(llm: LLM, prompt: list[int], domain: str, **kw: object) -> RequestOutput:
    (out,) = llm.generate([prompt], GREEDY, cache_domain=domain, **kw)  # type: ignore[arg-type]
    return out


def spill_a(llm: LLM) -> RequestOutput:
    """a caches its prompt, b's flood evicts it through the host tier down to disk
    (all but the block a's floor keeps on the device and the one in the host tier)."""
    out = run(llm, PROMPT_A, "t:a")
    run(llm, FLOOD_B, "t:b")
    settle(llm)
    return out


def bury_a(llm: LLM) -> RequestOutput:
    """a caches its prompt, then two floods of its own push all of it down to disk
    (a's floor and its host share then hold its newer blocks), as a restart needs."""
    out = run(llm, PROMPT_A, "t:a")
    run(llm, FLOOD_B, "t:a")
    run(llm, FLOOD_2, "t:a")
    settle(llm)
    assert files_by_block(llm, llm_path(llm), PROMPT_A).keys() == set(range(7))
    return out


def restarted_with_a_on_disk(model: pathlib.Path, path: pathlib.Path, block_bytes: int) -> LLM:
    """An engine with L3 in `path` buries a's prompt on disk (`bury_a`) and closes; returns
    a fresh engine over the same disk (empty pool and host tier)."""
    llm = with_l3(model, path, block_bytes)
    bury_a(llm)
    llm.engine.close()
    return with_l3(model, path, block_bytes)


def llm_path(llm: LLM) -> pathlib.Path:
    return disk_of(llm).files.root
