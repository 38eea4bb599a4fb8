"""The stored-response map: tenant scope, TTL, the caps (no tenant ever evicts another's), and
its integrity under any ops."""

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


# The serialized size of `entry(..., text)`: 65 bytes plus the text.
BASE = 65


def store(clock: Clock, **caps: int) -> ResponseStore:
    """A store with generous caps unless given."""
    limits = {
        "max_entries": 100,
        "max_per_tenant": 100,
        "max_bytes": 10_000,
        "max_bytes_per_tenant": 10_000,
        "max_record_bytes": 10_000,
        **caps,
    }
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


def test_the_entry_cap_never_evicts_another_tenants_entries() -> None:
    s = store(Clock(), max_entries=2)
    assert s.put(entry("r0", tenant="t0")) and s.put(entry("r1", tenant="t1"))
    assert s.put(entry("r2", tenant="t2")) is False  # full of others': refused, not evicted
    assert s.get("t2", "r2") is None
    assert s.get("t0", "r0") is not None and s.get("t1", "r1") is not None
    assert s.put(entry("r3", tenant="t1"))  # room made among t1's own
    assert s.get("t1", "r1") is None and s.get("t0", "r0") is not None
    s.check_integrity()


def test_one_tenant_past_its_cap_evicts_only_its_own_oldest() -> None:
    s = store(Clock(), max_per_tenant=2)
    s.put(entry("b1", tenant="b"))
    for i in range(3):
        s.put(entry(f"a{i}"))
    assert s.get("a", "a0") is None and s.get("a", "a2") is not None
    assert s.get("b", "b1") is not None
    s.check_integrity()


def test_the_size_counts_the_whole_record() -> None:
    assert entry("r", text="x" * 10).size == BASE + 10
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "x" * 500}}
    turn = {"role": "assistant", "content": None, "tool_calls": [call]}
    body = '{"tool_choice": {"pad": "' + "y" * 700 + '"}}'
    assert StoredResponse("r", "a", (turn,), body).size > 1200  # arguments and tool_choice


def test_the_tenant_byte_quota_evicts_its_own_oldest_and_refuses_what_never_fits() -> None:
    s = store(Clock(), max_bytes_per_tenant=3 * (BASE + 10), max_record_bytes=BASE + 20)
    s.put(entry("b1", tenant="b", text="x" * 10))
    for i in range(5):
        assert s.put(entry(f"a{i}", text="x" * 10))
    assert [s.get("a", f"a{i}") is not None for i in range(5)] == [False] * 2 + [True] * 3
    assert s.tenant_bytes("a") == 3 * (BASE + 10) and s.get("b", "b1") is not None
    assert s.put(entry("huge", text="x" * 21)) is False  # over the record bound
    assert s.get("a", "huge") is None and s.tenant_bytes("a") == 3 * (BASE + 10)
    s.check_integrity()


def test_the_store_wide_byte_cap_refuses_rather_than_evicts_others() -> None:
    size = BASE + 10
    s = store(Clock(), max_bytes=4 * size, max_bytes_per_tenant=2 * size)
    for tenant in ("a", "b"):
        for i in range(2):
            assert s.put(entry(f"{tenant}{i}", tenant, text="x" * 10))
    assert s.put(entry("c0", "c", text="x" * 10)) is False
    assert all(s.get(t, f"{t}{i}") is not None for t in ("a", "b") for i in range(2))
    assert s.put(entry("a2", "a", text="x" * 10))  # a makes room among its own
    assert s.get("a", "a0") is None and s.get("b", "b0") is not None
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
    s = store(
        clock,
        max_entries=4,
        max_per_tenant=2,
        max_bytes=4 * BASE + 20,
        max_bytes_per_tenant=2 * BASE + 15,
        max_record_bytes=BASE + 10,
    )
    for op, rid, tenant, n in ops:
        if op == "put":
            s.get(tenant, rid)  # expires what is due, so what follows is the put's doing
            others = {k for k, e in s._entries.items() if e.tenant_id != tenant}
            new = entry(rid, tenant, "x" * n)
            stored = s.put(new)
            assert (s.get(tenant, rid) is new) == stored
            assert others <= set(s._entries), "a put never evicts another tenant's entry"
        elif op == "get":
            got = s.get(tenant, rid)
            assert got is None or got.tenant_id == tenant
        elif op == "delete":
            s.delete(tenant, rid)
            assert s.get(tenant, rid) is None
        else:
            clock.now += n
        s.check_integrity()
