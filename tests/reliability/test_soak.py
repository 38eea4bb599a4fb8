"""A soak, compressed (issue 46, the soak item): the attacks of the hostile suite for a
while, then quiet, then the server must be as it was. A server left running under
attack was reported slow long after the attack ended; whatever the attacks leave
behind (work that outlives its request, threads, live requests) shows here as work
done while nobody sends anything, threads that grow with each round, or requests still
counted as running.

Two rounds of the same attack: the first starts every pool a grammar or a mask needs
(they start lazily), the second must add no thread. After each, the engine goes idle
within a bound, and then the process does next to no work; the bystanders' streams are
then exactly what they were on a quiet server.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.reliability.live import sample_sum, scrape_metrics
from tests.utils.hostile_server import LiveServer

pytestmark = pytest.mark.slow

ROUND_S = 20.0  # how long each round of the attack lasts
ATTACK_THREADS = 4
IDLE_TIMEOUT_S = 60.0  # the longest the engine may take to empty once the attack stops
QUIET_WINDOW_S = 5.0
# CPU seconds the server may use in QUIET_WINDOW_S while nobody sends anything: an idle
# server uses a few hundredths; a mask fill or a compile left running uses a core.
QUIET_CPU_S = 1.0
THREAD_SLACK = 4
# An ambiguous grammar: every mask is slower than the last (tens of ms to about a second).
SLOW_GRAMMAR = 'start: w\nw: w w | w w w | /[a-z]/ | /[a-z]+/ | " "'
# Constraints that are refused when compiled (400) or end alone at a dead end (200).
REFUSED_OR_ENDED: tuple[dict[str, Any], ...] = (
    {"guided_grammar": 'start: "a" start'},
    {"guided_grammar": 'start: /[a-z ]*/ x\nx: "a" x'},
    {"guided_regex": r"[^\s\S]"},
    {"guided_json": '{"type":"array","items":' * 2000 + "{}" + "}" * 2000},
    {"temperature": 1, "seed": 1, "guided_grammar": r"start: /[a-z]{12}/ /[^\s\S]/"},
)


def _attack(server: LiveServer, index: int, stop: threading.Event) -> list[int]:
    """One attacker thread until `stop`: streams under a new slow grammar each time, every
    other one cut after a few events (the server aborts it mid-mask), and between them a
    constraint that is refused or ends alone. Returns the statuses it got."""
    statuses: list[int] = []
    headers = {"Authorization": f"Bearer {server.attacker_key}"}
    with httpx.Client(base_url=server.base_url, timeout=120, headers=headers) as client:
        n = 0
        while not stop.is_set():
            n += 1
            body = {"model": "tiny", "prompt": "w", "max_tokens": 48, "temperature": 1,
                    "seed": n, "stream": True,
                    "guided_grammar": f'{SLOW_GRAMMAR} | "s{index}x{n}"'}  # fmt: skip
            with client.stream("POST", "/v1/completions", json=body) as r:
                statuses.append(r.status_code)
                for events, _ in enumerate(r.iter_lines()):
                    if n % 2 and events >= 3:
                        break  # closing the stream aborts the request
            extra = REFUSED_OR_ENDED[n % len(REFUSED_OR_ENDED)]
            body = {"model": "tiny", "prompt": "hi", "max_tokens": 16, **extra}
            statuses.append(client.post("/v1/completions", json=body).status_code)
    return statuses


def _round(server: LiveServer) -> list[int]:
    stop = threading.Event()
    with ThreadPoolExecutor(ATTACK_THREADS) as pool:
        futures = [pool.submit(_attack, server, i, stop) for i in range(ATTACK_THREADS)]
        time.sleep(ROUND_S)
        stop.set()
        return [s for f in futures for s in f.result()]


def _wait_idle(server: LiveServer) -> None:
    """Until the engine runs and queues nothing (the aborts and dead ends are done)."""
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        text = scrape_metrics(server.base_url)
        busy = (sample_sum(text, "vllm:num_requests_running") or 0) + (
            sample_sum(text, "vllm:num_requests_waiting") or 0
        )
        if busy == 0:
            return
        assert time.monotonic() < deadline, f"{busy} requests still live after the attack"
        time.sleep(0.25)


def _proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds used so far, live threads) of process `pid`, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # After the command name: utime and stime are fields 12 and 13, num_threads 18.
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[17])


def _quiet_cpu_s(pid: int) -> float:
    """CPU seconds the server used in a window in which nobody sent it anything."""
    before, _ = _proc_stat(pid)
    time.sleep(QUIET_WINDOW_S)
    after, _ = _proc_stat(pid)
    return after - before


def test_attack_then_quiet_leaves_nothing_running(live_server: LiveServer) -> None:
    pid = live_server.gw.proc.pid
    after_round: list[int] = []
    for _ in range(2):
        statuses = _round(live_server)
        assert set(statuses) <= {200, 400, 429, 503}, sorted(set(statuses))
        assert 200 in statuses and 400 in statuses
        _wait_idle(live_server)
        time.sleep(1.0)  # a mask fill started before an abort may still end
        used = _quiet_cpu_s(pid)
        assert used < QUIET_CPU_S, f"the idle server used {used:.2f} CPU s in {QUIET_WINDOW_S} s"
        after_round.append(_proc_stat(pid)[1])
    # The second round found every pool started: it adds no thread of its own (a round is
    # dozens of requests; the slack is for worker threads that come and go when idle).
    assert after_round[1] <= after_round[0] + THREAD_SLACK, after_round
    with live_server.bystanders.running():
        pass
    assert live_server.bystanders.failures() == []
    assert live_server.bystanders.stalls() == []
