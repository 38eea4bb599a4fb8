"""A hostile tenant against a live `cloister serve`, while two other tenants stream.

Each attack runs with the bystanders streaming (tests/reliability/live.py). After
every attack: the bystanders' streams are exactly what they were on a quiet server,
no reply was a 5xx other than 503, every 503 had Retry-After, and every error body
was in OpenAI's format. The last test checks the usage ledger against what every
tenant received. The tests share one server and run in file order.
"""

from __future__ import annotations

import io
import sqlite3
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from tests.reliability.live import (
    ADMIN,
    Reply,
    problems,
    reply_usage,
    send,
    server_errors,
    stream_chat,
    stream_error_events,
    usage_rows,
    wait_for_usage,
)
from tests.reliability.strategies import Raw, chat_bodies, completion_bodies, encode
from tests.utils.hostile_server import AUTH_FAILURE_WINDOW_S, MAX_NUM_SEQS, MAX_WAITING, LiveServer

FUZZ_EXAMPLES = 60
# An upload that takes longer than this must not keep the bystanders from completing a
# stream meanwhile (one takes well under a second on a quiet server).
UPLOAD_BUSY_S = 3.0


def judge(server: LiveServer, reply: Reply) -> list[str]:
    """`problems(reply)`, errors sent inside a 200 stream, and a note of the attacker's 200s."""
    found = problems(reply)
    found += [f"{reply.what}: error after 200: {e[:300]}" for e in stream_error_events(reply.body)]
    if reply.status == 200 and not found:
        request_id, usage = reply_usage(reply)
        if request_id is None:
            found.append(f"{reply.what}: a 200 without an id: {reply.body[:300]!r}")
        else:
            server.attacker_ok[request_id] = usage
    return found


def post_raw(server: LiveServer, client: httpx.Client, path: str, body: Any) -> Reply:
    """POSTs `body` as hostile JSON text with the attacker's key."""
    text = encode(body)
    return send(
        client,
        "POST",
        path,
        token=server.attacker_key,
        content=text,
        headers={"Content-Type": "application/json"},
        what=f"POST {path} {text[:400]!r}",
    )


def fuzz(server: LiveServer, path: str, bodies: Any) -> list[str]:
    """Sends FUZZ_EXAMPLES hostile bodies to `path`; every problem found, not just the first."""
    found: list[str] = []
    with httpx.Client(base_url=server.base_url, timeout=120) as client:

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: all problems are kept
            suppress_health_check=list(HealthCheck),
        )
        @given(body=bodies)
        def one(body: Any) -> None:
            found.extend(judge(server, post_raw(server, client, path, body)))

        one()
    return list(dict.fromkeys(found))  # generation repeats examples; each problem once


def assert_unharmed(server: LiveServer, found: list[str], *, stalls: bool = True) -> None:
    """No problem in the attacker's replies (`found`), and the bystanders' streams of the
    last attack were unchanged (and, by default, not stalled); all reported at once."""
    harm = list(found) + server.bystanders.failures()
    if stalls:
        harm += server.bystanders.stalls()
    health = httpx.get(server.base_url + "/health", timeout=30)
    assert health.status_code == 200, health.text
    assert harm == [], "\n".join([*harm, "server errors:", *server_errors(server.gw)])


def test_fuzzed_chat_fields(live_server: LiveServer) -> None:
    with live_server.bystanders.running():
        found = fuzz(live_server, "/v1/chat/completions", chat_bodies())
    assert_unharmed(live_server, found)


def test_fuzzed_completion_fields(live_server: LiveServer) -> None:
    with live_server.bystanders.running():
        found = fuzz(live_server, "/v1/completions", completion_bodies())
    assert_unharmed(live_server, found)


# The inputs the issue names (defects 1 and 16), each sent while the bystanders stream.
ISSUE_INPUTS: dict[str, tuple[str, Any]] = {
    "top_p 1e-300": ("/v1/completions", {"prompt": "hi", "top_p": 1e-300, "temperature": 1}),
    "top_p 5e-324": ("/v1/completions", {"prompt": "hi", "top_p": 5e-324, "temperature": 1}),
    "temperature 1e-300": ("/v1/completions", {"prompt": "hi", "temperature": 1e-300}),
    "lone surrogate content": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "a\ud800b"}]},
    ),
    "lone surrogate prompt": ("/v1/completions", {"prompt": "\udfff"}),
    "JSON nested 1000 deep": ("/v1/completions", {"prompt": Raw("[" * 1000 + "]" * 1000)}),
    "5000-digit integer": ("/v1/completions", {"prompt": "hi", "seed": Raw("9" * 5000)}),
    "logit_bias NaN": ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": float("nan")}}),
    "presence_penalty Infinity": (
        "/v1/completions",
        {"prompt": "hi", "presence_penalty": float("inf")},
    ),
}


@pytest.mark.parametrize("name", list(ISSUE_INPUTS))
def test_issue_inputs_are_refused_or_served(live_server: LiveServer, name: str) -> None:
    path, fields = ISSUE_INPUTS[name]
    body = {"model": "tiny", "max_tokens": 4, **fields}
    with (
        live_server.bystanders.running(),
        httpx.Client(base_url=live_server.base_url, timeout=120) as client,
    ):
        replies = [post_raw(live_server, client, path, body) for _ in range(3)]
    found = [p for r in replies for p in judge(live_server, r)]
    found += [f"{r.what} -> {r.status}" for r in replies if r.status not in (200, 400)]
    found += [
        f"internal error text: {r.body}"
        for r in replies
        if r.status == 400 and "index" in r.json()["error"]["message"]
    ]
    assert_unharmed(live_server, found)


# Issue 46: constraints that can never finish or match are 400s when compiled (item 3,
# the impossible grammars, item 6); free text then a dead end is a 200 that ends with
# "length", keeping and billing what it delivered (item 4). Each beside the bystanders.
CONSTRAINT_ATTACKS: dict[str, tuple[dict[str, Any], int]] = {
    "grammar that never finishes": ({"guided_grammar": 'start: "a" start'}, 400),
    "rule that never finishes": ({"guided_grammar": 'start: /[a-z ]*/ x\nx: "a" x'}, 400),
    "regex nothing matches": ({"guided_regex": r"[^\s\S]"}, 400),
    "schema text nested 5000 deep": (
        {"guided_json": '{"type":"array","items":' * 5000 + "{}" + "}" * 5000},
        400,
    ),
    "free text then a dead end": (
        {"temperature": 1, "seed": 1, "guided_grammar": r"start: /[a-z]{12}/ /[^\s\S]/"},
        200,
    ),
}


@pytest.mark.parametrize("name", list(CONSTRAINT_ATTACKS))
def test_constraints_that_cannot_finish_are_refused_or_ended_alone(
    live_server: LiveServer, name: str
) -> None:
    fields, status = CONSTRAINT_ATTACKS[name]
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 24, **fields}
    with (
        live_server.bystanders.running(),
        httpx.Client(base_url=live_server.base_url, timeout=120) as client,
    ):
        replies = [post_raw(live_server, client, "/v1/completions", body) for _ in range(3)]
    found = [p for r in replies for p in judge(live_server, r)]
    found += [f"{r.what} -> {r.status}, not {status}" for r in replies if r.status != status]
    for r in replies:
        if r.status == 200:
            choice = r.json()["choices"][0]
            if choice["finish_reason"] != "length" or not choice["text"]:
                found.append(f"{r.what}: wanted the text before the dead end: {r.body[:300]}")
    assert_unharmed(live_server, found)


# An ambiguous grammar whose masks grow slower with each token (tens to hundreds of ms).
SLOW_GRAMMAR = 'start: w\nw: w w | w w w | /[a-z]/ | /[a-z]+/ | " "'


def test_grammars_slow_to_mask_hold_only_their_own_requests(live_server: LiveServer) -> None:
    """Issue 46, item 5: four streams of ambiguous grammars, each one new (so that no
    refusal of a known slow grammar helps), beside the bystanders: their masks are made
    off the step (filled ahead; a sequence whose mask is not ready sits steps out), so
    the bystanders' streams do not stall and their text is unchanged."""

    def one(i: int) -> list[str]:
        found: list[str] = []
        with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
            for n in range(3):
                grammar = f'{SLOW_GRAMMAR} | "q{i}x{n}"'  # a new grammar each time
                body = {"model": "tiny", "prompt": "w", "max_tokens": 40, "temperature": 1,
                        "seed": n, "guided_grammar": grammar}  # fmt: skip
                reply = post_raw(live_server, client, "/v1/completions", body)
                found += judge(live_server, reply)
                if reply.status != 200:
                    found.append(f"{reply.what} -> {reply.status}: {reply.body[:300]}")
        return found

    with live_server.bystanders.running(), ThreadPoolExecutor(4) as pool:
        found = [p for ps in pool.map(one, range(4)) for p in ps]
    assert_unharmed(live_server, found)


def test_tiny_temperature_means_greedy(live_server: LiveServer) -> None:
    """A temperature below 1e-5 decodes greedily (as in vLLM), it does not give garbage."""
    bystander = live_server.bystanders.members[0]
    body = {**bystander.body, "temperature": 1e-38}
    with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
        result = stream_chat(client, live_server.attacker_key, body)
    assert result.status == 200 and result.done and not result.errors, result.raw
    assert result.text == bystander.expected


def test_admin_flood_with_bad_tokens(live_server: LiveServer) -> None:
    def bad_call(i: int) -> Reply:
        with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
            return send(
                client,
                "GET",
                f"{ADMIN}/tenants",
                token=f"clo-adm-forged{i:04d}",
                what=f"admin flood #{i}",
            )

    with live_server.bystanders.running(), ThreadPoolExecutor(max_workers=40) as pool:
        replies = list(pool.map(bad_call, range(40)))
    found = [p for r in replies for p in problems(r)]
    found += [f"{r.what} -> {r.status}" for r in replies if r.status not in (401, 429)]
    if not any(r.status == 429 for r in replies):
        found.append("40 bad credentials from one address were never throttled")
    assert_unharmed(live_server, found)
    _wait_out_the_throttle(live_server)


def _wait_out_the_throttle(server: LiveServer) -> None:
    """The operator's valid token works again once the flood's window has passed."""
    deadline = time.monotonic() + 4 * AUTH_FAILURE_WINDOW_S + 10
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    while True:
        r = httpx.get(server.base_url + f"{ADMIN}/whoami", headers=headers, timeout=30)
        if r.status_code == 200:
            return
        assert r.status_code == 429 and "retry-after" in r.headers, r.text
        assert time.monotonic() < deadline, "the throttle outlasted its window"
        time.sleep(min(float(r.headers["retry-after"]), AUTH_FAILURE_WINDOW_S))


def _register_tiny_model(server: LiveServer) -> None:
    r = httpx.post(
        server.base_url + f"{ADMIN}/models",
        json={
            "name": "tiny",
            "source": str(server.model_dir),
            "format": "safetensors",
            "context_length": 512,
        },
        headers={"Authorization": f"Bearer {server.admin_token}"},
        timeout=60,
    )
    assert r.status_code in (201, 409), r.text


def zip_bomb() -> bytes:
    """1.9 GiB of zeros as the adapter's weights (under the declared-size cap), about 9 MB
    zipped, next to a valid config."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr(
            "adapter_config.json",
            '{"r": 8, "peft_type": "LORA", "base_model_name_or_path": "tiny"}',
        )
        with z.open("adapter_model.safetensors", "w") as f:
            chunk = bytes(1 << 20)
            for _ in range(1946):
                f.write(chunk)
    return buf.getvalue()


def many_entries(count: int = 50_000) -> bytes:
    """A zip of `count` one-byte files."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(count):
            z.writestr(f"f/{i}.bin", b"x")
    return buf.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("bomb", ["zip bomb", "50k entries"])
def test_upload_bombs(live_server: LiveServer, bomb: str) -> None:
    _register_tiny_model(live_server)
    data = zip_bomb() if bomb == "zip bomb" else many_entries()
    with (
        live_server.bystanders.running(),
        httpx.Client(base_url=live_server.base_url, timeout=300) as client,
    ):
        sent_at = time.monotonic()
        reply = send(
            client,
            "POST",
            f"{ADMIN}/adapters/upload?name=bomb-{len(data)}&base_model=tiny&owner_tenant=attacker",
            token=live_server.admin_token,
            content=data,
            headers={"Content-Type": "application/zip"},
            what=bomb,
        )
        answered_at = time.monotonic()
    found = problems(reply)
    if not 400 <= reply.status < 500:
        found.append(f"{bomb} -> {reply.status} {reply.body[:300]}")
    busy = answered_at - sent_at
    # A long validation is fine if it happens beside the tenants, not in their way.
    if busy > UPLOAD_BUSY_S and not live_server.bystanders.progressed_between(sent_at, answered_at):
        found.append(f"no bystander stream completed during the {busy:.1f} s upload")
    assert_unharmed(live_server, found)


def test_database_write_stall(live_server: LiveServer) -> None:
    """Another connection holds SQLite's write lock for 6 s, longer than busy_timeout."""
    held = threading.Event()

    def hold_lock() -> None:
        conn = sqlite3.connect(live_server.db_path, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(6.0)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    locker = threading.Thread(target=hold_lock)
    replies: list[Reply] = []
    with (
        live_server.bystanders.running(),
        httpx.Client(base_url=live_server.base_url, timeout=120) as client,
    ):
        locker.start()
        assert held.wait(30)
        while locker.is_alive():
            replies.append(
                send(
                    client,
                    "POST",
                    "/v1/chat/completions",
                    token=live_server.attacker_key,
                    json_body=body,
                    what="chat during the database stall",
                )
            )
        locker.join()
    assert_unharmed(live_server, [p for r in replies for p in judge(live_server, r)], stalls=False)


def test_overload_at_three_times_capacity(live_server: LiveServer) -> None:
    capacity = MAX_NUM_SEQS + MAX_WAITING
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Write a long poem."}],
        "max_tokens": 24,
    }

    def one(i: int) -> Reply:
        with httpx.Client(base_url=live_server.base_url, timeout=120) as client:
            return send(
                client,
                "POST",
                "/v1/chat/completions",
                token=live_server.attacker_key,
                json_body=body,
                what=f"overload #{i}",
            )

    with (
        live_server.bystanders.running(allow_overload=True),
        ThreadPoolExecutor(max_workers=3 * capacity) as pool,
    ):
        replies = list(pool.map(one, range(3 * capacity)))
    statuses = [r.status for r in replies]
    assert 503 in statuses, "the burst never overloaded the engine: the test proves nothing"
    found = [p for r in replies for p in judge(live_server, r)]
    found += [f"{r.what} -> {r.status}" for r in replies if r.status not in (200, 429, 503)]
    assert_unharmed(live_server, found, stalls=False)


def test_usage_ledger_matches_what_tenants_received(live_server: LiveServer) -> None:
    """Runs last: every completed reply has exactly its usage; refusals bill nothing."""
    completed = live_server.bystanders.completed_ids()
    wanted = set(live_server.attacker_ok) | {i for ids in completed.values() for i in ids}
    wait_for_usage(live_server.db_path, wanted)
    rows = usage_rows(live_server.db_path)
    by_id = {r["request_id"]: r for r in rows}
    conn = sqlite3.connect(f"file:{live_server.db_path}?mode=ro", uri=True)
    tenant_ids = dict(conn.execute("SELECT name, id FROM tenants").fetchall())
    conn.close()
    lost, wrong, extra = [], [], []
    for b in live_server.bystanders.members:
        sent = {r.request_id: r for r in b.results if r.status == 200 and r.done and r.request_id}
        for request_id, result in sent.items():
            row = by_id.get(request_id)
            if row is None:
                lost.append(request_id)
            elif result.usage and (row["prompt_tokens"], row["completion_tokens"]) != (
                result.usage["prompt_tokens"],
                result.usage["completion_tokens"],
            ):
                wrong.append((row, result.usage))
        extra += [
            {k: r[k] for k in ("request_id", "status", "finish_reason", "client_disconnected")}
            for r in rows
            if r["tenant_id"] == tenant_ids[b.name]
            and r["status"] == 200
            and r["request_id"] not in sent
        ]
    for request_id, usage in live_server.attacker_ok.items():
        row = by_id.get(request_id)
        if row is None:
            lost.append(request_id)
        elif usage and (row["prompt_tokens"], row["completion_tokens"]) != (
            usage["prompt_tokens"],
            usage["completion_tokens"],
        ):
            wrong.append((row, usage))
    # Defect 3: a refused request is recorded with its status and zero billable tokens.
    billed_refusals = [
        {k: r[k] for k in ("request_id", "status", "prompt_tokens", "cost_pico_usd")}
        for r in rows
        if r["status"] >= 400
        and (r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"], r["cost_pico_usd"])
        != (0, 0, 0, 0)
    ]
    harm = [f"{len(lost)} completed replies have no usage record: {lost[:5]}"] if lost else []
    harm += [f"stored {row}, the client got {usage}" for row, usage in wrong]
    harm += [f"usage of a bystander request that did not complete: {r}" for r in extra]
    harm += [f"a refused request was billed: {r}" for r in billed_refusals]
    assert harm == [], "\n".join(harm)
