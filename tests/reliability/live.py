"""Helpers of the hostile-tenant suite: a live `cloister serve`, its database, and bystanders.

A bystander is a well-behaved tenant that streams the same greedy chat completion
over and over while an attack runs. Its expected text is computed while the server
is quiet; every stream it gets during the attack must match it exactly.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.processes import GatewayProcess

ADMIN = "/admin/api/v1"
MODEL = "tiny"
# The longest wait of a bystander for its stream's next line (the first one included)
# that still counts as "not stalled": generous against busy CI cores, far below
# the stalls of the issue (4.8 s to 17 s of a frozen event loop).
STALL_LIMIT_S = 4.0


@dataclass(frozen=True)
class Reply:
    """One HTTP exchange as the suite judges it."""

    status: int
    headers: dict[str, str]
    body: str
    what: str  # a short description of the request, for assertion messages

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


def problems(reply: Reply) -> list[str]:
    """What is wrong with a reply whatever the request was: a 5xx other than 503,
    a 503 without Retry-After, or an error that is not in OpenAI's format."""
    found: list[str] = []
    where = f"{reply.what} -> {reply.status} {reply.body[:300]!r}"
    if reply.status < 0:
        found.append(f"no response: {where}")
    if reply.status >= 500 and reply.status != 503:
        found.append(f"5xx: {where}")
    if reply.status == 503 and "retry-after" not in reply.headers:
        found.append(f"503 without Retry-After: {where}")
    if reply.status >= 400 and not is_openai_error(reply.body):
        found.append(f"error body not in OpenAI format: {where}")
    return found


def is_openai_error(body: str) -> bool:
    """True for `{"error": {"message": str, "type": str, "param": ..., "code": ...}}`."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if not isinstance(data, dict) or not isinstance(data.get("error"), dict):
        return False
    error = data["error"]
    return (
        isinstance(error.get("message"), str)
        and isinstance(error.get("type"), str)
        and {"param", "code"} <= set(error)
    )


def stream_error_events(body: str) -> list[str]:
    """The `data:` events of an SSE body that carry an error (a failure after the 200)."""
    return [
        line
        for line in body.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]" and '"error"' in line
    ]


def send(
    client: httpx.Client,
    method: str,
    path: str,
    *,
    token: str | None,
    what: str,
    content: bytes | None = None,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request, the whole response read (streams too).

    A dropped connection is retried once on a fresh one (a server that closes a
    keep-alive connection after a 500 breaks the *next* request on it); a second drop
    is the reply, with status -1.
    """
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    if json_body is not None:
        content = json.dumps(json_body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    try:
        return _exchange(client, method, path, content, all_headers, what)
    except httpx.TransportError:
        pass
    with httpx.Client(base_url=client.base_url, timeout=client.timeout) as fresh:
        try:
            return _exchange(fresh, method, path, content, all_headers, what)
        except httpx.TransportError as exc:
            return Reply(-1, {}, f"connection failed: {exc!r}", what)


def _exchange(
    client: httpx.Client,
    method: str,
    path: str,
    content: bytes | None,
    headers: dict[str, str],
    what: str,
) -> Reply:
    with client.stream(method, path, content=content, headers=headers) as r:
        body = r.read().decode(errors="replace")
    return Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, body, what)


@dataclass(frozen=True)
class StreamResult:
    """One streamed chat completion as a client saw it."""

    status: int
    headers: dict[str, str]
    text: str
    request_id: str | None
    usage: dict[str, Any] | None
    finish_reason: str | None
    done: bool  # the stream ended with `data: [DONE]`
    errors: list[str]
    max_gap_s: float  # the longest wait for a line, the first one included
    raw: str
    started_at: float = 0.0  # time.monotonic() when the request was sent
    ended_at: float = 0.0  # and when its last line arrived
    token_times: tuple[float, ...] = ()  # time.monotonic() of each event that carried text
    cut: bool = False  # the client stopped reading at its deadline (`stream_chat(deadline_s=)`)


def bystander_body(prompt: str, max_tokens: int) -> dict[str, Any]:
    """The greedy streamed chat request a bystander sends."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def stream_chat(
    client: httpx.Client, key: str, body: dict[str, Any], *, deadline_s: float | None = None
) -> StreamResult:
    """Streams one chat completion; collects its text, usage, the arrival time of each
    piece of text and the longest pause. `deadline_s`: stop reading (and close the stream)
    once a line arrives that much after the request was sent (`cut` is then True)."""
    text: list[str] = []
    errors: list[str] = []
    raw: list[str] = []
    times: list[float] = []
    usage = request_id = finish = None
    done = cut = False
    gap = 0.0
    started = last = time.monotonic()
    with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        if r.status_code != 200:
            raw.append(r.read().decode(errors="replace"))
        else:
            for line in r.iter_lines():
                now = time.monotonic()
                gap, last = max(gap, now - last), now
                raw.append(line)
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    continue
                event = json.loads(data)
                if "error" in event:
                    errors.append(data)
                    continue
                request_id = event.get("id", request_id)
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices", []):
                    piece = choice.get("delta", {}).get("content") or ""
                    if piece:
                        times.append(now)
                    text.append(piece)
                    finish = choice.get("finish_reason") or finish
                if deadline_s is not None and now - started > deadline_s:
                    cut = True
                    break
    return StreamResult(
        r.status_code,
        {k.lower(): v for k, v in r.headers.items()},
        "".join(text),
        request_id,
        usage,
        finish,
        done,
        errors,
        gap,
        "\n".join(raw),
        started,
        time.monotonic(),
        tuple(times),
        cut,
    )


@dataclass
class Bystander:
    """A well-behaved tenant streaming one greedy request in a loop on its own thread."""

    name: str
    key: str
    body: dict[str, Any]
    expected: str
    expected_usage: dict[str, Any]
    results: list[StreamResult] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)


class Bystanders:
    """Runs bystanders during an attack and says what went wrong for them."""

    def __init__(self, base_url: str, bystanders: list[Bystander]) -> None:
        self.base_url = base_url
        self.members = bystanders
        self.allow_overload = False
        self._since = {b.name: 0 for b in bystanders}

    @contextmanager
    def running(self, *, allow_overload: bool = False) -> Iterator[None]:
        """Bystanders stream while the `with` body runs (each at least twice).

        `allow_overload`: a bystander's *new* request may be refused with 503 and
        Retry-After (the engine is full); it retries. A stream once admitted must
        still complete unchanged.
        """
        stop = threading.Event()
        threads = [
            threading.Thread(target=self._loop, args=(b, stop), daemon=True) for b in self.members
        ]
        before = {b.name: len(b.results) for b in self.members}
        self.allow_overload = allow_overload
        self._since = before
        for t in threads:
            t.start()
        try:
            yield
        finally:
            # Let every bystander finish at least two streams that overlapped the attack.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(
                sum(1 for r in b.results[before[b.name] :] if r.status == 200) < 2
                for b in self.members
            ):
                time.sleep(0.05)
            stop.set()
            for t in threads:
                t.join(timeout=120)

    def _loop(self, b: Bystander, stop: threading.Event) -> None:
        with httpx.Client(base_url=self.base_url, timeout=120) as client:
            while not stop.is_set():
                b.starts.append(time.monotonic())
                try:
                    result = stream_chat(client, b.key, b.body)
                except (httpx.HTTPError, ValueError) as exc:
                    result = StreamResult(
                        -1, {}, "", None, None, None, False, [repr(exc)], 0.0, repr(exc)
                    )
                b.results.append(result)
                if result.status == 503:
                    time.sleep(0.2)

    def failures(self) -> list[str]:
        """Every way the last `running()` hurt a bystander (empty: they were untouched)."""
        found: list[str] = []
        for b in self.members:
            results = b.results[self._since[b.name] :]
            ok = [r for r in results if r.status == 200]
            if len(ok) < 2:
                found.append(f"{b.name}: only {len(ok)} streams completed")
            for r in results:
                if r.status == 503 and self.allow_overload and "retry-after" in r.headers:
                    continue
                if r.status != 200:
                    found.append(f"{b.name}: status {r.status}: {r.raw[:300]!r}")
                    continue
                if r.errors:
                    found.append(f"{b.name}: error in the stream: {r.errors[0][:300]}")
                if r.text != b.expected or not r.done:
                    found.append(
                        f"{b.name}: stream changed: {r.text!r} != {b.expected!r} (done={r.done})"
                    )
                if r.usage is not None and _tokens(r.usage) != _tokens(b.expected_usage):
                    found.append(f"{b.name}: usage {r.usage} != {b.expected_usage}")
        return found

    def stalls(self) -> list[str]:
        """Bystander streams of the last `running()` that paused longer than STALL_LIMIT_S."""
        return [
            f"{b.name}: a stream paused {r.max_gap_s:.1f} s"
            for b in self.members
            for r in b.results[self._since[b.name] :]
            if r.max_gap_s > STALL_LIMIT_S
        ]

    def progressed_between(self, start: float, end: float) -> bool:
        """True when some bystander sent a request and got all of it between the two times."""
        return any(
            start <= r.started_at and r.ended_at <= end and r.status == 200 and r.done
            for b in self.members
            for r in b.results
        )

    def completed_ids(self) -> dict[str, list[str]]:
        """Request ids of every stream each bystander got completely, over all runs."""
        return {
            b.name: [r.request_id for r in b.results if r.status == 200 and r.done and r.request_id]
            for b in self.members
        }


def _tokens(usage: dict[str, Any]) -> tuple[int, int]:
    return int(usage["prompt_tokens"]), int(usage["completion_tokens"])


def usage_rows(db_path: Path) -> list[dict[str, Any]]:
    """Every stored usage record, read straight from the SQLite file."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM usage_records")]
    finally:
        conn.close()


def wait_for_usage(db_path: Path, request_ids: set[str], timeout_s: float = 30.0) -> None:
    """Waits until the metering sink stored a record for each id, or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if request_ids <= {r["request_id"] for r in usage_rows(db_path)}:
            return
        time.sleep(0.25)


def admin_headers(token: str) -> dict[str, str]:
    """The Authorization header of an admin token."""
    return {"Authorization": f"Bearer {token}"}


def server_errors(gw: GatewayProcess, limit: int = 5) -> list[str]:
    """The ends of the server's last ERROR log lines (where a traceback names its
    exception), for assertion messages."""
    lines = [line for line in gw.logs().splitlines() if '"level": "ERROR"' in line]
    return [line[-600:] for line in lines[-limit:]]


def reply_usage(reply: Reply) -> tuple[str | None, dict[str, Any] | None]:
    """The request id and reported usage of a 200 reply, JSON or server-sent events."""
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        request_id = usage = None
        for line in reply.body.splitlines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[len("data: ") :])
            request_id = request_id or event.get("id")
            usage = event.get("usage") or usage
        return request_id, usage
    data = reply.json()
    return data.get("id"), data.get("usage")


def scrape_metrics(base_url: str, token: str | None = None) -> str:
    """The server's /metrics text; with an operator's admin token, tenant series too."""
    headers = {} if token is None else admin_headers(token)
    r = httpx.get(base_url + "/metrics", headers=headers, timeout=30)
    r.raise_for_status()
    return r.text


def sample_sum(text: str, sample: str, **labels: str) -> float | None:
    """The sum of the samples named `sample` (e.g. `vllm:num_preemptions_total`) whose
    labels include `labels`, in Prometheus text; None when there is no such series."""
    from prometheus_client.parser import text_string_to_metric_families

    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and labels.items() <= s.labels.items()
    ]
    return sum(values) if values else None
