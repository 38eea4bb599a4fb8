"""The stored-response map: tenant scope, TTL, the three caps, and its integrity under any ops."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.response_store import ResponseStore, StoredResponse


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        """Now."""
        return self.now


def entry(response_id: str, tenant: str = "a", text: str = "hi") -> StoredResponse:
    """A stored response of `tenant` whose conversation is one user turn."""
    return StoredResponse(
        response_id=response_id,
        tenant_id=tenant,
        conversation=({"role": "user", "content": text},),
        body="{}",
    )


def store(clock: Clock, **caps: int) -> ResponseStore:
    """A store with generous caps unless given."""
    limits = {"max_entries": 100, "max_per_tenant": 100, "max_chars": 10_000, **caps}
    return ResponseStore(ttl_s=10.0, clock=clock, **limits)


def test_an_entry_is_its_tenants_only() -> None:
    s = store(Clock())
    s.put(entry("r1", "a"))
    assert s.get("a", "r1") is not None
    assert s.get("b", "r1") is None and s.get("a", "r2") is None
    assert s.delete("b", "r1") is False and s.get("a", "r1") is not None
    assert s.delete("a", "r1") is True and s.get("a", "r1") is None
    s.check_integrity()


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    s = store(clock)
    s.put(entry("r1"))
    clock.now = 5.0
    s.put(entry("r2"))
    clock.now = 10.0
    assert s.get("a", "r1") is None and s.get("a", "r2") is not None
    assert len(s) == 1
    clock.now = 15.0
    assert s.get("a", "r2") is None and len(s) == 0
    s.check_integrity()


def test_the_oldest_are_evicted_past_the_entry_cap() -> None:
    s = store(Clock(), max_entries=2)
    for i in range(3):
        s.put(entry(f"r{i}", tenant=f"t{i}"))
    assert s.get("t0", "r0") is None
    assert s.get("t1", "r1") is not None and s.get("t2", "r2") is not None
    s.check_integrity()


def test_one_tenant_past_its_cap_evicts_only_its_own_oldest() -> None:
    s = store(Clock(), max_per_tenant=2)
    s.put(entry("b1", tenant="b"))
    for i in range(3):
        s.put(entry(f"a{i}"))
    assert s.get("a", "a0") is None and s.get("a", "a2") is not None
    assert s.get("b", "b1") is not None
    s.check_integrity()


def test_the_character_cap_evicts_oldest_and_refuses_what_never_fits() -> None:
    s = store(Clock(), max_chars=30)
    s.put(entry("r1", text="x" * 10))  # 12 chars with its body
    s.put(entry("r2", text="x" * 10))
    s.put(entry("r3", text="x" * 10))
    assert s.get("a", "r1") is None and s.get("a", "r3") is not None
    s.put(entry("huge", text="x" * 100))
    assert s.get("a", "huge") is None and s.get("a", "r3") is not None
    s.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "get", "delete", "tick"]),
            st.sampled_from(["r1", "r2", "r3", "r4", "r5"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 12),
        ),
        max_size=40,
    )
)
def test_integrity_holds_under_any_sequence(ops: list[tuple[str, str, str, int]]) -> None:
    clock = Clock()
    s = store(clock, max_entries=4, max_per_tenant=2, max_chars=40)
    for op, rid, tenant, n in ops:
        if op == "put":
            s.put(entry(rid, tenant, "x" * n))
            assert s.get(tenant, rid) is not None
        elif op == "get":
            got = s.get(tenant, rid)
            assert got is None or got.tenant_id == tenant
        elif op == "delete":
            s.delete(tenant, rid)
            assert s.get(tenant, rid) is None
        else:
            clock.now += n
        s.check_integrity()
