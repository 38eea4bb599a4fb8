"""KV-cache events: what the engine's prefix cache announces, in vLLM's format.

The engine is the real one over the fake fast model (tests/utils/fast_fake_model.py):
the scheduler and the KV cache manager register and evict blocks as they always do.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import pytest
import zmq

from engine.kv_cache.cache_key import block_hash
from engine.kv_cache.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from engine.kv_events_publisher import KVEventPublisher
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.utils.fast_fake_model import fast_fake_llm_engine
from tests.utils.kv_inspect import cached_block_ids
from tests.utils.services import free_port

BLOCK = 16


def run(engine: LLMEngine, prompt: list[int], domain: str, rid: str) -> None:
    """Serves one greedy request to its end."""
    engine.add_request(
        EngineRequest(
            prompt_token_ids=tuple(prompt),
            params=SamplingParams(max_tokens=2, temperature=0.0),
            request_id=rid,
            cache_domain=domain,
        )
    )
    while engine.has_unfinished():
        engine.step()


def events_of(engine: LLMEngine) -> list[Any]:
    """The events the cache logged since the last call."""
    assert engine.kv.events is not None
    batch = engine.kv.events.take()
    return [] if batch is None else list(batch.events)


def stored(events: list[Any]) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


@pytest.mark.parametrize("index", ["hash", "radix"])
def test_cached_blocks_are_announced_as_one_chain_per_domain(index: str) -> None:
    engine = fast_fake_llm_engine(num_blocks=64, block_size=BLOCK, prefix_cache=index)
    engine.kv.record_events("CPU")
    assert events_of(engine) == [AllBlocksCleared()]  # a new engine holds nothing
    prompt = list(range(100, 140))  # 40 tokens: two full blocks
    run(engine, prompt, "tenant-a", "a-1")
    (a,) = stored(events_of(engine))
    assert a.token_ids == prompt[:32] and a.block_size == BLOCK and a.parent_block_hash is None
    assert a.cache_domain == "tenant-a" and a.lora_name is None and a.medium == "CPU"
    # The chain: the second block's hash is taken on the first's.
    first, second = a.block_hashes
    assert second == block_hash(first, prompt[16:32])
    run(engine, prompt, "tenant-a", "a-2")  # a hit: nothing new is cached
    assert stored(events_of(engine)) == []
    run(engine, prompt, "tenant-b", "b-1")  # the same tokens in another domain
    (b,) = stored(events_of(engine))
    assert b.cache_domain == "tenant-b" and b.token_ids == prompt[:32]
    assert not set(b.block_hashes) & set(a.block_hashes)  # nothing to match across tenants


def test_both_indexes_announce_the_same_hashes() -> None:
    hashes = []
    for index in ("hash", "radix"):
        engine = fast_fake_llm_engine(num_blocks=64, block_size=BLOCK, prefix_cache=index)
        engine.kv.record_events("CPU")
        run(engine, list(range(1, 50)), "t", "r")
        hashes.append([h for e in stored(events_of(engine)) for h in e.block_hashes])
    assert hashes[0] == hashes[1] and len(hashes[0]) == 3


def test_evicted_blocks_are_announced_removed() -> None:
    engine = fast_fake_llm_engine(num_blocks=8, block_size=BLOCK, max_model_len=128)
    engine.kv.record_events("CPU")
    events_of(engine)
    run(engine, list(range(200, 264)), "a", "a-1")  # 4 cached blocks of 8
    (a,) = stored(events_of(engine))
    run(engine, list(range(300, 396)), "b", "b-1")  # 6 blocks of 8: evicts some of a's
    events = events_of(engine)
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(a.block_hashes)
    assert [e.cache_domain for e in stored(events)] == ["b"]
    assert engine.kv.events is not None
    assert engine.kv.events.num_announced == len(cached_block_ids(engine.kv))


class VllmEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """vLLM's event base (vllm.distributed.kv_events), its layout only."""


class VllmStored(VllmEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class VllmRemoved(VllmEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None


class VllmCleared(VllmEvent, tag="AllBlocksCleared"):
    """vLLM's AllBlocksCleared."""


class VllmBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[VllmStored | VllmRemoved | VllmCleared]
    data_parallel_rank: int | None = None


def test_the_batch_is_vllm_s_wire_format() -> None:
    """vLLM's own structs (their layout, without our two trailing fields) decode our
    batches; ours read them back whole."""

    engine = fast_fake_llm_engine(num_blocks=8, block_size=BLOCK, max_model_len=128)
    engine.kv.record_events("CPU")
    run(engine, list(range(200, 264)), "a", "a-1")
    run(engine, list(range(300, 396)), "b", "b-1")
    assert engine.kv.events is not None
    ours = engine.kv.events.take()
    assert ours is not None
    payload = encode_batch(ours)
    theirs = msgspec.msgpack.decode(payload, type=VllmBatch)
    kinds = [type(e).__name__ for e in theirs.events]
    assert kinds[0] == "VllmCleared" and "VllmStored" in kinds and "VllmRemoved" in kinds
    first = next(e for e in theirs.events if isinstance(e, VllmStored))
    assert first.token_ids == list(range(200, 264)) and first.parent_block_hash is None
    assert decode_batch(payload) == ours


def test_the_publisher_sends_topic_sequence_and_batch() -> None:
    """Over ZeroMQ, as vLLM's publisher: [topic, 8-byte sequence, msgpack batch]; the
    publisher connects to a subscriber that binds (llm-d's indexer)."""
    port = free_port()
    context = zmq.Context.instance()
    sub = context.socket(zmq.SUB)
    sub.bind(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{port}", "kv@pod@m")
    try:
        got: list[list[bytes]] = []
        deadline = time.monotonic() + 10
        # A PUB drops what it sends before the subscription reaches it: send until heard.
        while not got and time.monotonic() < deadline:
            publisher.publish(KVEventBatch(ts=1.0, events=[AllBlocksCleared()]))
            if sub.poll(100):
                got.append(sub.recv_multipart())
        publisher.publish(KVEventBatch(ts=2.0, events=[BlockRemoved([b"x" * 32], "CPU")]))
        assert sub.poll(5000)
        last = sub.recv_multipart()
    finally:
        publisher.close()
        sub.close(linger=0)
    topic, seq, payload = got[0]
    assert topic == b"kv@pod@m" and len(seq) == 8
    assert int.from_bytes(last[1], "big") == int.from_bytes(seq, "big") + 1
    assert decode_batch(last[2]).events == [BlockRemoved([b"x" * 32], "CPU")]


def test_a_full_queue_drops_batches_counts_them_and_the_engine_reports_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step never waits for the publisher: past its queue, batches are dropped and
    counted, and the count reaches the engine's stats (and so /metrics)."""
    import engine.kv_events_publisher as publisher_module

    gate, sending = threading.Event(), threading.Event()

    def stuck_encode(batch: KVEventBatch) -> bytes:
        sending.set()
        gate.wait(10)  # a send that cannot finish yet
        return encode_batch(batch)

    monkeypatch.setattr(publisher_module, "encode_batch", stuck_encode)
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{free_port()}", "t", max_queue=2)
    try:
        publisher.publish(KVEventBatch(ts=0.0, events=[AllBlocksCleared()]))
        assert sending.wait(5)  # the thread holds the first batch
        started = time.monotonic()
        for i in range(7):  # two fit in the queue, five do not
            publisher.publish(KVEventBatch(ts=float(i), events=[AllBlocksCleared()]))
        assert time.monotonic() - started < 1.0  # never blocked on the stuck send
        assert publisher.dropped == 5
    finally:
        gate.set()
        publisher.close()

    engine = fast_fake_llm_engine(kv_events_endpoint=f"tcp://127.0.0.1:{free_port()}")
    assert engine.kv_events is not None
    engine.kv_events.dropped = 4  # as if a subscriber-less burst had overflowed it
    assert engine.stats().kv_events_dropped == 4
    assert fast_fake_llm_engine().stats().kv_events_dropped is None  # publishes nothing
    engine.kv_events.close()


def test_an_unusable_endpoint_is_refused() -> None:
    from engine.kv_events_endpoint import KVEventsEndpointError

    with pytest.raises(KVEventsEndpointError):
        KVEventPublisher("http://nowhere:1", "t")
    port = free_port()
    holder = zmq.Context.instance().socket(zmq.PUB)
    holder.bind(f"tcp://*:{port}")
    try:
        with pytest.raises(KVEventsEndpointError, match="cannot open"):
            KVEventPublisher(f"tcp://*:{port}", "t")  # the port is taken
    finally:
        holder.close(linger=0)
