"""The server side of the noisy-neighbour workload (tests/reliability/noisy.py): the run's
sizes (`Plan`) and a live `cloister serve` with its defaults but a small KV pool, the
victim's, the neighbour's and the attacker's keys, and an operator's admin token.

Used by tests/reliability/test_noisy_neighbour.py and bench/noisy_neighbour.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.gateway.processes import (
    SERVE_COMMAND,
    GatewayProcess,
    create_tenant_key,
    database,
    gateway_env,
    stop,
    wait_ready,
)
from tests.utils.principals import PEPPER
from tests.utils.services import free_port

# SmolLM2-135M's KV cache per token in fp32: 30 layers x 3 KV heads x 64 dims x (K, V)
# x 4 bytes.
SMOLLM2_KV_BYTES_PER_TOKEN = 30 * 3 * 64 * 2 * 4
SMOLLM2_NAME = "smollm2-135m-instruct"
# The switches of the scheduler and cache behaviour before the fix; "before" sets them,
# "after" takes the server's defaults.
OLD_BEHAVIOUR = {"kv_shares": "false", "fair_cached_share": "0"}


@dataclass(frozen=True)
class Plan:
    """The sizes of one run. The pool is `pool_blocks` blocks, so that the attack fills it."""

    victim_requests: int = 7  # timed victim requests per scenario
    victim_max_tokens: int = 24
    pool_blocks: int = 64
    block_size: int = 16
    kv_bytes_per_token: int = SMOLLM2_KV_BYTES_PER_TOKEN
    attacker_concurrency: int = 8  # the attacker tenant's max_concurrent limit
    attack_prompt_tokens: int = 96  # each long generation's prompt
    flood_prompt_tokens: int = 256
    flood_loops: int = 2
    neighbour_loops: int = 2
    neighbour_max_tokens: int = 24
    grammar_loops: int = 4
    grammar_max_tokens: int = 64
    request_timeout_s: float = 30.0  # a victim stream is cut after this long
    scenario_budget_s: float = 90.0  # no new victim request after this long in a scenario
    idle_cap_s: float = 15.0  # the longest the victim idles before its after-flood request
    seed: int = 7

    def __post_init__(self) -> None:
        for name in (
            "victim_requests",
            "victim_max_tokens",
            "pool_blocks",
            "block_size",
            "kv_bytes_per_token",
            "attack_prompt_tokens",
            "flood_prompt_tokens",
            "neighbour_max_tokens",
            "grammar_loops",
            "grammar_max_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.flood_loops < 1 or self.neighbour_loops < 1:
            raise ValueError("flood_loops and neighbour_loops must be at least 1")
        if self.attacker_concurrency <= self.flood_loops:
            raise ValueError("attacker_concurrency must exceed flood_loops (both scenario)")
        if min(self.request_timeout_s, self.scenario_budget_s, self.idle_cap_s) <= 0:
            raise ValueError("request_timeout_s, scenario_budget_s and idle_cap_s must be positive")
        if self.attack_prompt_tokens >= self.pool_tokens:
            raise ValueError("attack_prompt_tokens must be below the pool's tokens")
        if self.flood_prompt_tokens >= self.pool_tokens:
            raise ValueError("flood_prompt_tokens must be below the pool's tokens")

    @property
    def pool_tokens(self) -> int:
        """Tokens the KV pool holds."""
        return self.pool_blocks * self.block_size

    @property
    def kv_cache_bytes(self) -> int:
        """The server's CLOISTER_KV_CACHE_BYTES for exactly `pool_blocks` blocks."""
        return self.pool_tokens * self.kv_bytes_per_token

    @property
    def long_max_tokens(self) -> int:
        """A long generation's max_tokens: with its prompt, the whole pool (the server
        refuses a request that could never fit the pool)."""
        return self.pool_tokens - self.attack_prompt_tokens


@dataclass(frozen=True)
class NoisyServer:
    """A running server with the three tenants' keys and an operator's admin token."""

    gw: GatewayProcess
    model: str
    keys: Mapping[str, str]  # victim, neighbour, attacker
    operator_token: str
    plan: Plan

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>."""
        return self.gw.base_url


@contextmanager
def noisy_server(
    root: Path,
    plan: Plan,
    *,
    old: bool | None = None,
    model: Path | None = None,
    model_name: str = SMOLLM2_NAME,
    start_timeout_s: float = 300.0,
    threads: int | None = 1,
    **settings: Any,
) -> Iterator[NoisyServer]:
    """`cloister serve` with the server's defaults but a pool of `plan.pool_blocks` blocks.

    `old`: True: the behaviour before the fix (OLD_BEHAVIOUR); False: the defaults, also
    where this process's environment sets CLOISTER_KV_SHARES or _FAIR_CACHED_SHARE; None:
    whatever the environment says (how the test is run by hand against the old behaviour).
    `model`: a model folder or GGUF file (None: the bundled SmolLM2). `threads`: the
    server's torch and numba threads (OMP_NUM_THREADS, NUMBA_NUM_THREADS; None: their
    defaults, one a core). One, as the issue measured: on cores that other processes
    share, threads that wait for each other spin (an OpenMP worker of numba's pool spins
    beside the engine thread even when torch has one thread), and the figures swing
    twentyfold with the machine's other load.
    """
    from admin.identity import create_admin_token
    from engine.model.loader import default_model_path

    data_dir = root / "data"
    sessions = database(data_dir)
    keys = {
        "victim": create_tenant_key(sessions, "victim"),
        "neighbour": create_tenant_key(sessions, "neighbour"),
        "attacker": create_tenant_key(
            sessions, "attacker", max_concurrent=plan.attacker_concurrency
        ),
    }
    with sessions() as s:
        token = create_admin_token(s, pepper=PEPPER, role="admin", name="noisy").secret
    values: dict[str, Any] = {
        "model_name": model_name,
        "attention_backend": "auto",  # serve's default (the test gateways pin "torch")
        "max_model_len": 8192,
        "kv_cache_bytes": plan.kv_cache_bytes,
        "block_size": plan.block_size,
        "engine_log_interval_s": 0,
        "port": free_port(),
        **(OLD_BEHAVIOUR if old else {}),
        **settings,
    }
    env = gateway_env(data_dir, model or Path(default_model_path()), **values)
    if threads is not None:
        env["OMP_NUM_THREADS"] = env["NUMBA_NUM_THREADS"] = str(threads)
    if old is False:
        for name in OLD_BEHAVIOUR:
            if name not in settings:
                env.pop(f"CLOISTER_{name.upper()}", None)
    log_path = root / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            SERVE_COMMAND,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    gw = GatewayProcess(f"http://127.0.0.1:{values['port']}", proc, log_path)
    try:
        wait_ready(gw, start_timeout_s)
        yield NoisyServer(gw, model_name, keys, token, plan)
    finally:
        stop(gw)


def environment_behaviour() -> dict[str, str | None]:
    """The behaviour switches this process's environment passes to a server (None: the
    server's default)."""
    return {name: os.environ.get(f"CLOISTER_{name.upper()}") for name in OLD_BEHAVIOUR}
