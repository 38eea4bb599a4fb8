"""Multi-replica cache locality (the serving guide's section 12): router policies compared.

Three `cloister engine serve` processes of the tiny random-weight model (subprocesses,
as in tests/gateway/engine_servers.py) and, per policy, an in-thread gateway whose
engine client is a `ReplicaSetClient` over them: the same routing code a
`cloister serve --engine-urls` gateway runs. A "single" baseline sends everything to
one of the three engines (a one-URL replica set).

Workload: --tenants tenants, each with its own --system-tokens system prefix, and
--sessions conversations per tenant of --turns turns; each turn appends
--turn-tokens tokens (a user message and a fixed answer) to the session's history.
The turns run in rounds (every session's turn k, --concurrency at a time, then
turn k+1), each request carrying its session as the `user` field. (Keep the
sessions per round off a multiple of 3: round-robin would then send each session to
the same replica every turn, an accident of the submission order.) Then a hot prefix:
one new tenant sends --hot requests of one prompt at once, long enough to overlap.

Prints per policy: the fleet-wide prefix hit rate (cached / prompt tokens, from each
response's usage), TTFT p50/p95 (client side, streaming), the max/mean load over the
replicas (prompt tokens each engine looked up, its /internal/stats
prefix_cache_queries) for the workload and for the hot prefix. The last line is JSON.

    python bench/fleet.py                     # 4 tenants x 4 sessions x 3 turns, ~2 min on 2 cores
    python bench/fleet.py --tenants 2 --sessions 4 --turns 3 --hot 18  # smaller
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

# Run as a script (python bench/NAME.py), this folder is on the path, not the project's.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# ...and platform/ ahead of this folder, whose engine_hop.py would shadow the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from bench.nearest_rank import nearest_rank  # noqa: E402
from engine.model.tokenizer import load_tokenizer  # noqa: E402
from engine_hop.replica_set import ReplicaSetClient  # noqa: E402
from tests.gateway.engine_servers import SERVICE_TOKEN, engine_servers, gateway_over  # noqa: E402
from tests.utils.live_gateway import LiveGateway  # noqa: E402
from tests.utils.tiny_model import make_tiny_model_dir  # noqa: E402

POLICIES = ("round_robin", "session", "prefix_affine")
# Token ids drawn for the synthetic prompts: ordinary vocabulary, no special tokens.
TOKEN_RANGE = (1000, 40000)


@dataclass(frozen=True)
class Workload:
    """The shape of the traffic."""

    tenants: int = 4
    sessions: int = 4
    turns: int = 3
    system_tokens: int = 96
    turn_tokens: int = 48
    max_tokens: int = 2
    concurrency: int = 4
    hot: int = 24
    hot_max_tokens: int = 160
    seed: int = 0


@dataclass(frozen=True)
class Session:
    """One conversation: its tenant, its `user` and each turn's whole prompt."""

    tenant: int
    user: str
    prompts: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Served:
    """One response's figures."""

    prompt_tokens: int
    cached_tokens: int
    ttft_s: float


@dataclass(frozen=True)
class Figures:
    """One policy's results."""

    policy: str
    hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    load_max_mean: float
    hot_max_mean: float
    requests: int


def build_sessions(w: Workload) -> list[Session]:
    """Every session's prompts: its tenant's system prefix, then the growing history."""
    rng = random.Random(w.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]

    systems = [tokens(w.system_tokens) for _ in range(w.tenants)]
    sessions = []
    for tenant in range(w.tenants):
        for s in range(w.sessions):
            history = list(systems[tenant])
            prompts = []
            for _ in range(w.turns):
                history += tokens(w.turn_tokens)
                prompts.append(tuple(history))
            sessions.append(Session(tenant, f"session-{tenant}-{s}", tuple(prompts)))
    return sessions


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 when empty)."""
    return nearest_rank(xs, q) if xs else 0.0


def complete(
    http: httpx.Client,
    base_url: str,
    key: str,
    prompt: Sequence[int],
    *,
    user: str,
    max_tokens: int,
) -> Served:
    """One streamed completion; its usage and the time to its first chunk."""
    body = {
        "model": "tiny",
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "user": user,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, object] | None = None
    headers = {"authorization": f"Bearer {key}"}
    with http.stream(
        "POST", base_url + "/v1/completions", json=body, headers=headers, timeout=120
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if ttft is None and chunk.get("choices"):
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                usage = chunk["usage"]
    if usage is None or ttft is None:
        raise RuntimeError("the stream ended without a token or without usage")
    details = usage["prompt_tokens_details"]
    assert isinstance(details, dict)
    return Served(int(str(usage["prompt_tokens"])), int(details["cached_tokens"]), ttft)


def run_sessions(
    base_url: str, keys: Sequence[str], sessions: Sequence[Session], w: Workload
) -> list[Served]:
    """Every session's turns, round by round, `w.concurrency` requests at a time."""
    served: list[Served] = []
    with httpx.Client() as http, ThreadPoolExecutor(w.concurrency) as pool:
        for turn in range(w.turns):
            round_ = [
                pool.submit(
                    complete,
                    http,
                    base_url,
                    keys[s.tenant],
                    s.prompts[turn],
                    user=s.user,
                    max_tokens=w.max_tokens,
                )
                for s in sessions
            ]
            served += [f.result() for f in round_]
    return served


def run_hot(base_url: str, key: str, prompt: Sequence[int], w: Workload) -> list[Served]:
    """`w.hot` requests of one prompt from one tenant, all at once."""
    with httpx.Client() as http, ThreadPoolExecutor(w.hot) as pool:
        futures = [
            pool.submit(
                complete, http, base_url, key, prompt, user=f"hot-{i}", max_tokens=w.hot_max_tokens
            )
            for i in range(w.hot)
        ]
        return [f.result() for f in futures]


def hit_rate(served: Sequence[Served]) -> float:
    """Cached over prompt tokens, over every response."""
    prompt = sum(s.prompt_tokens for s in served)
    return sum(s.cached_tokens for s in served) / prompt if prompt else 0.0


def engine_queries(urls: Sequence[str]) -> list[int]:
    """Each engine's prompt tokens looked up so far."""
    auth = {"authorization": f"Bearer {SERVICE_TOKEN}"}
    return [
        int(
            httpx.get(u + "/internal/stats", headers=auth, timeout=10).json()[
                "prefix_cache_queries"
            ]
        )
        for u in urls
    ]


def max_mean(before: Sequence[int], after: Sequence[int]) -> float:
    """The busiest replica's share over the mean share (1.0: perfectly even)."""
    loads = [a - b for a, b in zip(after, before, strict=True)]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 0.0


@contextmanager
def policy_gateway(
    urls: Sequence[str], model_dir: Path, data_dir: Path, policy: str
) -> Iterator[LiveGateway]:
    """An in-thread gateway whose engine is a `ReplicaSetClient` over `urls` with `policy`."""
    tokenizer = load_tokenizer(model_dir)

    def client() -> ReplicaSetClient:
        return ReplicaSetClient(
            urls,
            token=SERVICE_TOKEN,
            tokenizer=tokenizer,
            model_name="tiny",
            policy=policy,
            poll_s=0.2,
        )

    with gateway_over(data_dir, client) as gw:
        yield gw


def measure(name: str, urls: Sequence[str], model_dir: Path, tmp: Path, w: Workload) -> Figures:
    """One policy ("single": round_robin over the first engine alone) on the workload."""
    policy, used = ("round_robin", urls[:1]) if name == "single" else (name, urls)
    sessions = build_sessions(w)
    data_dir = tmp / name
    data_dir.mkdir()
    with policy_gateway(used, model_dir, data_dir, policy) as gw:
        keys = [gw.tenant(f"{name}-tenant-{t}") for t in range(w.tenants)]
        before = engine_queries(urls)
        served = run_sessions(gw.base_url, keys, sessions, w)
        after = engine_queries(urls)
        hot_key = gw.tenant(f"{name}-hot")
        hot_prompt = build_sessions(Workload(tenants=1, sessions=1, turns=1, seed=w.seed + 1))
        hot = run_hot(gw.base_url, hot_key, hot_prompt[0].prompts[0], w)
        hot_after = engine_queries(urls)
    loads = (before, after) if name != "single" else (before[:1], after[:1])
    hot_loads = (after, hot_after) if name != "single" else (after[:1], hot_after[:1])
    ttfts = [s.ttft_s * 1000 for s in served]
    return Figures(
        policy=name,
        hit_rate=round(hit_rate(served), 4),
        ttft_p50_ms=round(percentile(ttfts, 0.5), 1),
        ttft_p95_ms=round(percentile(ttfts, 0.95), 1),
        load_max_mean=round(max_mean(*loads), 3),
        hot_max_mean=round(max_mean(*hot_loads), 3),
        requests=len(served) + len(hot),
    )


def main() -> None:
    """Runs the comparison and prints a table, then one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Workload()
    for field_name, value in asdict(defaults).items():
        parser.add_argument(f"--{field_name.replace('_', '-')}", type=int, default=value)
    args = parser.parse_args()
    w = Workload(**{k: getattr(args, k) for k in asdict(defaults)})
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cloister-fleet-") as folder:
        tmp = Path(folder)
        model_dir = make_tiny_model_dir(tmp / "model")
        with engine_servers(model_dir, tmp / "logs", 3) as engines:
            urls = [e.base_url for e in engines]
            results = [measure(n, urls, model_dir, tmp, w) for n in ("single", *POLICIES)]
    print(
        f"{'policy':<14} {'hit rate':>8} {'TTFT p50':>9} {'p95 ms':>7} {'load max/mean':>14} {'hot':>6}"
    )
    for r in results:
        print(
            f"{r.policy:<14} {r.hit_rate:>8.3f} {r.ttft_p50_ms:>9.1f} {r.ttft_p95_ms:>7.1f} "
            f"{r.load_max_mean:>14.2f} {r.hot_max_mean:>6.2f}"
        )
    document = {
        "workload": asdict(w),
        "replicas": 3,
        "replicas_in": "3 engine server subprocesses, in-thread gateways over ReplicaSetClient",
        "results": [asdict(r) for r in results],
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(document))


if __name__ == "__main__":
    main()
