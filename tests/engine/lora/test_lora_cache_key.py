"""The adapter's part of the cache key: name and content digest, never confusable."""

from __future__ import annotations

from engine.kv_cache.cache_key import CacheKey
from engine.sampling_params import SamplingParams
from tests.utils.engine_requests import make_sequence

D1, D2 = "1" * 64, "2" * 64


def _adapter_field(name: str | None, digest: str | None) -> str | None:
    seq = make_sequence(
        seq_id="s",
        request_id="s",
        index=0,
        prompt_token_ids=[1],
        params=SamplingParams(max_tokens=1),
        max_tokens=1,
        cache_domain="d",
        adapter=name,
        adapter_digest=digest,
    )
    return seq.cache_adapter


def test_adapter_identity_vectors_give_distinct_keys() -> None:
    vectors = [
        ("t:x", _adapter_field("a", D1)),
        ("t:xa", _adapter_field(None, None)),  # domain absorbing the adapter name
        ("t:x", _adapter_field(None, None)),  # the base model
        ("t:x", _adapter_field("a", D2)),  # same name, new weights
        ("t:x", _adapter_field("b", D1)),  # same weights, another name
        ("t:x", _adapter_field("a@" + D1, D2)),  # a name that embeds a digest
        ("t:x", f"a@{D1}"[:-1]),  # a cache-salt-like plain string, one char off
        ("t:x@", _adapter_field("a", D1)),
        (f"t:x{'a'}@{D1}", None),
        ("t:x", "a"),  # an adapter used as a bare cache-key field (no weights)
    ]
    keys = [CacheKey.derive(domain, adapter, "rev").digest for domain, adapter in vectors]
    assert len(set(keys)) == len(keys)
    public = {CacheKey.public(adapter, "rev").digest for _, adapter in vectors}
    assert len(public) == len({a for _, a in vectors}) and not public & set(keys)


def test_the_key_field_is_name_at_digest() -> None:
    assert _adapter_field("a", D1) == f"a@{D1}"
    assert _adapter_field("a", None) == "a"  # unloaded names keep the old meaning
    assert _adapter_field(None, None) is None
