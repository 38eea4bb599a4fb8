"""The noisy-neighbour workload against a live `cloister serve` (SmolLM2 on the CPU).

A victim tenant streams one fixed greedy chat completion, one request after another,
in six scenarios, and its time to first token (TTFT), gaps between tokens (ITL) and
end-to-end time are taken in each:

- alone: nobody else sends anything;
- fair: a well-behaved neighbour keeps two short chat requests in flight;
- fill: "fill and squeeze": the attacker keeps as many long generations open as its
  concurrency limit allows (EOS ignored, the largest max_tokens the pool accepts);
- flood: "KV flood": two loops of long, never-repeated prompts with max_tokens 1, to
  evict the victim's cached prefix; after its timed requests the victim waits while the
  flood sends two more pools' worth of prompt tokens, then repeats its prompt once more
  (`cached_after_flood`: that reply's `usage.prompt_tokens_details.cached_tokens`);
- both: fill and flood at once, within the same concurrency limit;
- grammar: `grammar_loops` loops of completions under ambiguous Lark grammars whose
  masks grow slower with each token (up to about a second), each grammar new, so that
  no refusal of a known slow grammar helps (issue 46, item 5).

During fill and both the attacker also sends requests over its limits (one generation
more than its concurrency limit, a prompt and max_tokens the pool cannot hold, a
negative max_tokens): each must be a 4xx in OpenAI's format. Every attacker reply is
kept for `live.problems()`.

Victim preemptions come from the operators' tenant series on /metrics
(`cloister_tenant_preemptions_suffered_total{tenant="victim"}`), None where the
server has no such series; the engine's total (`vllm:num_preemptions_total`) is kept
beside it. The loads run on an asyncio loop of their own thread, so that a scenario's
end cancels their streams (the server aborts them) at once.

Used by tests/reliability/test_noisy_neighbour.py and bench/noisy_neighbour.py.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.reliability.background import Loads
from tests.reliability.live import (
    Reply,
    StreamResult,
    bystander_body,
    problems,
    sample_sum,
    scrape_metrics,
    send,
    stream_chat,
    stream_error_events,
)
from tests.reliability.noisy_server import NoisyServer

SCENARIOS = ("alone", "fair", "fill", "flood", "both", "grammar")
ATTACKS = ("fill", "flood", "both", "grammar")
VICTIM_PROMPT = "Tell me a story about a lighthouse keeper."
NEIGHBOUR_PROMPTS = ("Name a colour.", "Say hello in French.", "What is 2 + 2?")
TOKEN_IDS = (1000, 40000)  # prompt token ids are drawn from here: no special tokens
KV_FULL = 0.9  # the long generations hold this share of the pool before the victim starts
# An ambiguous grammar: every mask is an Earley parse over all the ways to split the
# text so far, slower with each token (about 160 ms at the 60th on SmolLM2's vocabulary).
SLOW_GRAMMAR = 'start: w\nw: w w | w w w | /[a-z]/ | /[a-z]+/ | " "'


@dataclass(frozen=True)
class VictimRequest:
    """One victim stream as timed by the client. A stream cut at the deadline, or one that
    never produced text, counts the deadline as its TTFT and end (a lower bound)."""

    status: int
    ttft_s: float
    gaps_s: tuple[float, ...]
    e2e_s: float
    cached_tokens: int | None
    complete: bool  # 200, the whole stream, [DONE], within the deadline
    note: str = ""

    @classmethod
    def of(cls, r: StreamResult) -> VictimRequest:
        """The figures of one streamed result."""
        e2e = r.ended_at - r.started_at
        times = r.token_times
        ttft = times[0] - r.started_at if times else e2e
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        if r.cut and times:
            gaps.append(r.ended_at - times[-1])  # the wait it was cut in, at least
        details = (r.usage or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        complete = r.status == 200 and r.done and not r.cut and not r.errors
        note = "" if complete else (r.errors[0] if r.errors else r.raw[:300])
        return cls(
            r.status,
            ttft,
            tuple(gaps),
            e2e,
            None if cached is None else int(cached),
            complete,
            note,
        )


@dataclass
class Scenario:
    """What one scenario measured."""

    name: str
    victim: list[VictimRequest] = field(default_factory=list)
    attacker: list[Reply] = field(default_factory=list)  # every reply the attacker got
    probes: list[Reply] = field(default_factory=list)  # its over-limit requests
    neighbour: list[Reply] = field(default_factory=list)
    cached_after_flood: int | None = None
    victim_preemptions: float | None = None
    engine_preemptions: float | None = None
    flooded_tokens: int = 0  # prompt tokens of the flood's requests that were served
    # Fill and both, before the victim's first request: the highest share of the pool in
    # use seen, and whether the pool ran out (the engine preempted a sequence).
    kv_usage: float | None = None
    pool_ran_out: bool | None = None
    # Tokens the attack wrote (flood prompts, generated tokens) while the victim idled
    # before its `cached_after_flood` request.
    idle_pressure: int = 0
    duration_s: float = 0.0

    def figures(self) -> dict[str, Any]:
        """The victim's p50s (ms) and the scenario's counts, JSON-ready."""
        ttft = [v.ttft_s for v in self.victim]
        gaps = [g for v in self.victim for g in v.gaps_s]
        e2e = [v.e2e_s for v in self.victim]
        statuses: dict[str, int] = {}
        for r in self.attacker + self.probes:
            statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
        return {
            "ttft_p50_ms": _p50_ms(ttft),
            "itl_p50_ms": _p50_ms(gaps),
            "e2e_p50_ms": _p50_ms(e2e),
            "requests": len(self.victim),
            "complete": sum(v.complete for v in self.victim),
            "cached_tokens": [v.cached_tokens for v in self.victim],
            "cached_after_flood": self.cached_after_flood,
            "victim_preemptions": self.victim_preemptions,
            "engine_preemptions": self.engine_preemptions,
            "flooded_tokens": self.flooded_tokens,
            "kv_usage_at_start": self.kv_usage,
            "pool_ran_out_at_start": self.pool_ran_out,
            "idle_pressure_tokens": self.idle_pressure,
            "attacker_statuses": dict(sorted(statuses.items())),
            "neighbour_requests": len(self.neighbour),
            "duration_s": round(self.duration_s, 2),
        }

    def joined(self, later: Scenario) -> Scenario:
        """This scenario and a later run of the same one as one: their requests together,
        their counts added."""
        if later.name != self.name:
            raise ValueError(f"cannot join {later.name!r} to {self.name!r}")
        return Scenario(
            self.name,
            victim=self.victim + later.victim,
            attacker=self.attacker + later.attacker,
            probes=self.probes + later.probes,
            neighbour=self.neighbour + later.neighbour,
            cached_after_flood=later.cached_after_flood,
            victim_preemptions=_added(self.victim_preemptions, later.victim_preemptions),
            engine_preemptions=_added(self.engine_preemptions, later.engine_preemptions),
            flooded_tokens=self.flooded_tokens + later.flooded_tokens,
            kv_usage=self.kv_usage,
            pool_ran_out=self.pool_ran_out,
            idle_pressure=self.idle_pressure + later.idle_pressure,
            duration_s=self.duration_s + later.duration_s,
        )

    def attacker_problems(self) -> list[str]:
        """`live.problems()` of every attacker reply, errors inside a 200 stream, and any
        over-limit request that was not refused with a 4xx."""
        found = [p for r in self.attacker + self.probes for p in problems(r)]
        found += [
            f"{r.what}: error after 200: {e[:300]}"
            for r in self.attacker
            for e in stream_error_events(r.body)
        ]
        found += [
            f"{r.what}: over its limits, yet {r.status} {r.body[:200]!r}"
            for r in self.probes
            if not 400 <= r.status < 500
        ]
        return found


def _p50_ms(values: list[float]) -> float | None:
    return round(1000 * statistics.median(values), 2) if values else None


def ratios(figures: Mapping[str, Mapping[str, Any]], against: str) -> dict[str, dict[str, Any]]:
    """Each attack's victim p50s divided by those of the `against` scenario."""
    base = figures[against]
    out: dict[str, dict[str, Any]] = {}
    for name in ATTACKS:
        if name not in figures:
            continue
        out[name] = {}
        for key in ("ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms"):
            a, b = figures[name][key], base[key]
            out[name][key.removesuffix("_ms")] = round(a / b, 3) if a and b else None
    return out


class Workload:
    """Runs the scenarios against one server."""

    def __init__(
        self, server: NoisyServer, *, progress: Callable[[int], None] | None = None
    ) -> None:
        self.server = server
        self.plan = server.plan
        self.progress = progress or (lambda n: None)
        self._rng = random.Random(self.plan.seed)
        self._opened = 0  # long generations whose 200 arrived
        # The attacker's requests sent and not yet answered, and those answered so far:
        # an over-concurrency probe means something only while every slot is held.
        self._in_flight = 0
        self._ended = 0
        self._flooded = 0  # flood prompt tokens served
        self._pressure = 0  # KV the attack wrote: flood prompt tokens + streamed tokens
        self._scenario = Scenario("")
        self.victim_body = {
            **bystander_body(VICTIM_PROMPT, self.plan.victim_max_tokens),
            "model": server.model,
        }

    # -- the victim ---------------------------------------------------------------

    def victim_once(self) -> VictimRequest:
        """One victim stream, cut at the plan's deadline."""
        timeout = httpx.Timeout(self.plan.request_timeout_s, connect=30)
        with httpx.Client(base_url=self.server.base_url, timeout=timeout) as client:
            try:
                result = stream_chat(
                    client,
                    self.server.keys["victim"],
                    self.victim_body,
                    deadline_s=self.plan.request_timeout_s,
                )
            except httpx.HTTPError as exc:  # a read timeout: no line for the whole deadline
                now = time.monotonic()
                started = now - self.plan.request_timeout_s
                result = StreamResult(
                    -1, {}, "", None, None, None, False, [repr(exc)], 0.0, "", started, now
                )
        self.progress(1)
        return VictimRequest.of(result)

    # -- one scenario -------------------------------------------------------------

    def run(self, name: str) -> Scenario:
        """Runs scenario `name` (SCENARIOS) and returns what it measured."""
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}")
        self.wait_idle()
        scenario = self._scenario = Scenario(name)
        before = self._preemptions()
        started = time.monotonic()
        if name in ("fill", "both"):  # while the attacker has free slots: reach validation
            scenario.probes = self._probes(over_concurrency=False)
        with Loads(self._loads(name)) as loads:
            if name in ("fill", "both"):
                self._wait_opened(self.plan.attacker_concurrency - self._flood_loops(name))
                scenario.probes += self._probes(over_concurrency=True)
                scenario.kv_usage, scenario.pool_ran_out = self._wait_pool_full(before[1])
            elif name in ("flood", "grammar"):
                time.sleep(1.0)
            deadline = started + self.plan.scenario_budget_s
            for _ in range(self.plan.victim_requests):
                if time.monotonic() > deadline:
                    break
                scenario.victim.append(self.victim_once())
            if name in ("flood", "both"):
                scenario.cached_after_flood = self._after_flood()
        if loads.failure is not None:
            raise RuntimeError(f"the {name} load failed") from loads.failure
        scenario.duration_s = time.monotonic() - started
        scenario.flooded_tokens = self._flooded
        after = self._preemptions()
        scenario.victim_preemptions = _delta(before[0], after[0])
        scenario.engine_preemptions = _delta(before[1], after[1])
        return scenario

    def run_all(self) -> dict[str, Scenario]:
        """A warm-up victim request (its prompt cached), every scenario in order, and the
        fair one again at the end, joined to the first: the attacks are judged against
        the fair case measured on both sides of them (a busy machine's speed drifts over
        a run's minutes, and seven requests alone make a noisy median)."""
        self.victim_once()
        scenarios = {name: self.run(name) for name in SCENARIOS}
        scenarios["fair"] = scenarios["fair"].joined(self.run("fair"))
        return scenarios

    def wait_idle(self, timeout_s: float = 120.0) -> None:
        """Waits until the engine runs and queues nothing (aborted streams are gone)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = scrape_metrics(self.server.base_url)
            busy = (sample_sum(text, "vllm:num_requests_running") or 0) + (
                sample_sum(text, "vllm:num_requests_waiting") or 0
            )
            if busy == 0:
                return
            time.sleep(0.25)
        raise TimeoutError("the engine did not go idle between scenarios")

    def _preemptions(self) -> tuple[float | None, float | None]:
        text = scrape_metrics(self.server.base_url, self.server.operator_token)
        victim = sample_sum(text, "cloister_tenant_preemptions_suffered_total", tenant="victim")
        if victim is None and "cloister_tenant_preemptions_suffered" in text:
            victim = 0.0  # the series exists, the victim was never preempted
        return victim, sample_sum(text, "vllm:num_preemptions_total")

    def _flood_loops(self, name: str) -> int:
        return self.plan.flood_loops if name in ("flood", "both") else 0

    def _wait_opened(self, n: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._opened < n and time.monotonic() < deadline:
            time.sleep(0.05)

    def _wait_pool_full(
        self, preemptions: float | None, timeout_s: float = 30.0
    ) -> tuple[float, bool]:
        """Waits until the attack holds most of the pool, or the pool ran out (the engine
        preempted a sequence since the scenario began, when it had counted `preemptions`).
        Returns the highest KV use seen, and whether the pool ran out."""
        deadline, peak = time.monotonic() + timeout_s, 0.0
        while True:
            text = scrape_metrics(self.server.base_url)
            peak = max(peak, sample_sum(text, "vllm:kv_cache_usage_perc") or 0.0)
            now = sample_sum(text, "vllm:num_preemptions_total") or 0.0
            ran_out = now > (preemptions or 0.0)
            if peak >= KV_FULL or ran_out or time.monotonic() > deadline:
                return peak, ran_out
            time.sleep(0.2)

    def _after_flood(self) -> int | None:
        """The victim's cached tokens once the attack wrote two pools' worth of tokens more
        (flood prompts and generated tokens) while the victim was idle, or after
        `plan.idle_cap_s` (an attacker squeezed by its KV share writes slowly, mostly in
        recomputed prompts, which are not counted)."""
        mark, deadline = self._pressure, time.monotonic() + self.plan.idle_cap_s
        while self._pressure - mark < 2 * self.plan.pool_tokens and time.monotonic() < deadline:
            time.sleep(0.05)
        self._scenario.idle_pressure = self._pressure - mark
        check = self.victim_once()
        return check.cached_tokens if check.complete else None

    # -- the background loads -----------------------------------------------------

    def _loads(self, name: str) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        self._opened = self._flooded = self._pressure = 0
        if name == "alone":
            return []
        if name == "fair":
            return [self._neighbour_loop(i) for i in range(self.plan.neighbour_loops)]
        if name == "grammar":
            return [self._grammar_loop(i) for i in range(self.plan.grammar_loops)]
        floods = self._flood_loops(name)
        loads = [self._flood_loop(i) for i in range(floods)]
        if name in ("fill", "both"):
            n = self.plan.attacker_concurrency - floods
            loads += [self._long_generation_loop(i) for i in range(n)]
        return loads

    def _ids(self, n: int) -> list[int]:
        return [self._rng.randrange(*TOKEN_IDS) for _ in range(n)]

    def _headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.server.keys[tenant]}"}

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server.base_url, timeout=httpx.Timeout(600.0, connect=30.0)
        )

    def _neighbour_loop(self, index: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def loop() -> None:
            async with self._client() as client:
                i = index
                while True:
                    body = {
                        "model": self.server.model,
                        "messages": [
                            {
                                "role": "user",
                                "content": NEIGHBOUR_PROMPTS[i % len(NEIGHBOUR_PROMPTS)],
                            },
                        ],
                        "max_tokens": self.plan.neighbour_max_tokens,
                        "temperature": 0,
                    }
                    i += 1
                    reply = await _post(
                        client,
                        "/v1/chat/completions",
                        body,
                        self._headers("neighbour"),
                        f"neighbour chat #{i}",
                    )
                    self._scenario.neighbour.append(reply)
                    if reply.status != 200:
                        await asyncio.sleep(0.5)

        return loop

    def _attacker_loop(
        self, make: Callable[[int], tuple[dict[str, Any], str]], on_ok: Callable[[], None]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        """A loop of the attacker's completions: `make(i)` gives the i-th body and its
        description; `on_ok` counts a 200; a refusal waits its Retry-After."""

        async def loop() -> None:
            async with self._client() as client:
                i = 0
                while True:
                    i += 1
                    body, what = make(i)
                    self._in_flight += 1
                    try:
                        reply = await _post(
                            client, "/v1/completions", body, self._headers("attacker"), what
                        )
                    finally:
                        self._in_flight -= 1
                        self._ended += 1
                    self._scenario.attacker.append(reply)
                    if reply.status == 200:
                        on_ok()
                    else:
                        await asyncio.sleep(_retry_after(reply))

        return loop

    def _flood_loop(self, index: int) -> Callable[[], Coroutine[Any, Any, None]]:
        n = self.plan.flood_prompt_tokens

        def make(i: int) -> tuple[dict[str, Any], str]:
            body = {"model": self.server.model, "prompt": self._ids(n), "max_tokens": 1}
            return body, f"flood #{index}.{i} ({n} prompt tokens, max_tokens 1)"

        def flooded() -> None:
            self._flooded += n
            self._pressure += n

        return self._attacker_loop(make, flooded)

    def _grammar_loop(self, index: int) -> Callable[[], Coroutine[Any, Any, None]]:
        def make(i: int) -> tuple[dict[str, Any], str]:
            body = {
                "model": self.server.model,
                "prompt": f"w{index}.{i}",
                "max_tokens": self.plan.grammar_max_tokens,
                "temperature": 1.0,
                "seed": i,
                "guided_grammar": f'{SLOW_GRAMMAR} | "q{index}x{i}"',  # new each time
            }
            return body, f"slow grammar #{index}.{i}"

        return self._attacker_loop(make, lambda: None)

    def _long_generation_loop(self, index: int) -> Callable[[], Coroutine[Any, Any, None]]:
        async def loop() -> None:
            async with self._client() as client:
                i = 0
                while True:
                    i += 1
                    body = self._long_body()
                    what = f"long generation #{index}.{i} (max_tokens {body['max_tokens']})"
                    reply = await self._stream(client, body, what)
                    if reply.status != 200:
                        await asyncio.sleep(_retry_after(reply))

        return loop

    def _long_body(self, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.server.model,
            "prompt": self._ids(self.plan.attack_prompt_tokens),
            "max_tokens": self.plan.long_max_tokens,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            **extra,
        }

    async def _stream(self, client: httpx.AsyncClient, body: dict[str, Any], what: str) -> Reply:
        """One attacker stream, read to its end; a cancelled one keeps what it read."""
        lines: list[str] = []
        status, headers = -1, {}
        self._in_flight += 1
        try:
            async with client.stream(
                "POST", "/v1/completions", json=body, headers=self._headers("attacker")
            ) as r:
                status, headers = r.status_code, {k.lower(): v for k, v in r.headers.items()}
                if r.status_code != 200:
                    lines.append((await r.aread()).decode(errors="replace"))
                else:
                    self._opened += 1
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            self._pressure += 1  # about one token an event
                        if len(lines) < 20 or '"error"' in line:
                            lines.append(line)
        except httpx.HTTPError as exc:
            lines.append(f"connection failed: {exc!r}")
        finally:
            self._in_flight -= 1
            self._ended += 1
            reply = Reply(status, headers, "\n".join(lines), f"attacker {what}")
            self._scenario.attacker.append(reply)
        return reply

    def _probes(self, *, over_concurrency: bool) -> list[Reply]:
        """The attacker's requests over its limits: one more than its concurrency limit
        (sent while its generations hold every slot), or else a prompt and max_tokens
        the whole pool cannot hold and a negative max_tokens."""
        if over_concurrency:
            # max_tokens 1: should it be let through, it is over at once.
            asks = {"one request over the concurrency limit": self._long_body(max_tokens=1)}
        else:
            asks = {
                "prompt and max_tokens over the whole pool": self._long_body(
                    max_tokens=self.plan.pool_tokens
                ),
                "negative max_tokens": self._long_body(max_tokens=-1),
            }
        with httpx.Client(base_url=self.server.base_url, timeout=120) as client:

            def probe(what: str, body: dict[str, Any]) -> Reply:
                return send(
                    client,
                    "POST",
                    "/v1/completions",
                    token=self.server.keys["attacker"],
                    json_body={**body, "stream": False},
                    what=f"attacker probe: {what}",
                )

            if over_concurrency:
                return [self._probe_while_full(lambda: probe(*next(iter(asks.items()))))]
            return [probe(what, body) for what, body in asks.items()]

    def _probe_while_full(self, probe: Callable[[], Reply]) -> Reply:
        """`probe()` sent while the attacker's loops hold every slot of its concurrency
        limit. Their short requests end and start again all the time, so a probe that
        an attacker request ended around (it may have taken the freed slot) proves
        nothing and is sent again; a 200 with every slot held throughout stands."""
        limit = self.plan.attacker_concurrency
        reply = Reply(-1, {}, "no probe sent", "attacker probe")
        for _ in range(PROBE_TRIES):
            deadline = time.monotonic() + 10.0
            while self._in_flight < limit and time.monotonic() < deadline:
                time.sleep(0.005)
            ended = self._ended
            reply = probe()
            if reply.status != 200 or (self._ended == ended and self._in_flight >= limit):
                return reply
        return reply


PROBE_TRIES = 20  # over-concurrency probes sent before a 200 is taken as it is


async def _post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str], what: str
) -> Reply:
    try:
        r = await client.post(path, json=body, headers=headers)
    except httpx.HTTPError as exc:
        return Reply(-1, {}, f"connection failed: {exc!r}", what)
    return Reply(r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.text, what)


def _retry_after(reply: Reply) -> float:
    try:
        return min(max(float(reply.headers.get("retry-after", "0.2")), 0.05), 2.0)
    except ValueError:
        return 0.2


def _added(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    return after - (before or 0.0)
