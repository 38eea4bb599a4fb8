"""Fair under attack: one tenant cannot slow another down or wipe its cache.

Against a live `cloister serve` with its defaults, SmolLM2 on the CPU and a KV pool of
64 blocks (1,024 tokens, which the attack fills many times over), a victim tenant
streams one greedy prompt while an attacker runs "fill and squeeze" (as many long
generations as its concurrency limit allows), a "KV flood" (long one-token prompts)
and both at once (tests/reliability/noisy.py). The victim's TTFT p50 and ITL p50 under
each attack stay within 1.5x of what they are beside a well-behaved neighbour (two
short requests at a time, measured before and after the attacks), the victim is never
preempted, its cached prefix survives the flood, and the attacker's over-limit requests
get clear 4xx in OpenAI's format (no 5xx).

The whole run happens once, in the module's fixture (about 2-3 minutes on two busy
cores); the tests judge its figures. Run by hand with CLOISTER_KV_SHARES=false
CLOISTER_FAIR_CACHED_SHARE=0 (the behaviour before the fix) it fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.reliability.noisy import ATTACKS, KV_FULL, Scenario, Workload, ratios
from tests.reliability.noisy_server import Plan, environment_behaviour, noisy_server

pytestmark = [pytest.mark.slow, pytest.mark.serial]

GOAL_RATIO = 1.5  # victim p50 under attack / beside a fair neighbour


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Scenario]]:
    """Every scenario, once, on one server (the environment's behaviour switches apply)."""
    root = tmp_path_factory.mktemp("noisy")
    with noisy_server(root, Plan()) as server:
        scenarios = Workload(server).run_all()
    figures = {name: s.figures() for name, s in scenarios.items()}
    # Shown with -s, and in the log of a failed run.
    print(
        json.dumps(
            {
                "behaviour": environment_behaviour(),
                "figures": figures,
                "vs_fair": ratios(figures, "fair"),
                "vs_alone": ratios(figures, "alone"),
            }
        )
    )
    yield scenarios


def _summary(run: dict[str, Scenario], attack: str) -> str:
    keys = ("ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms", "complete", "victim_preemptions")
    rows = {n: {k: run[n].figures()[k] for k in keys} for n in ("alone", "fair", attack)}
    return json.dumps(rows)


def test_the_baselines_are_sound(run: dict[str, Scenario]) -> None:
    for name, runs in (("alone", 1), ("fair", 2)):  # the fair case before and after the attacks
        figures = run[name].figures()
        assert figures["complete"] == figures["requests"] == runs * Plan().victim_requests, figures
        assert figures["victim_preemptions"] in (None, 0), figures
    assert all(r.status == 200 for r in run["fair"].neighbour), [
        r.body[:200] for r in run["fair"].neighbour if r.status != 200
    ]
    assert len(run["fair"].neighbour) >= 2, "the neighbour sent (almost) nothing"


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_attack_really_loads_the_server(run: dict[str, Scenario], attack: str) -> None:
    scenario = run[attack]
    figures = scenario.figures()
    assert any(r.status == 200 for r in scenario.attacker), figures
    if attack in ("fill", "both"):  # the long generations filled the pool before the victim came
        assert figures["kv_usage_at_start"] >= KV_FULL or figures["pool_ran_out_at_start"], figures
        assert figures["engine_preemptions"] > 0, figures
    if attack == "flood":  # two pools' worth of prompts went through while the victim idled
        assert figures["idle_pressure_tokens"] >= 2 * Plan().pool_tokens, figures


@pytest.mark.parametrize("attack", ATTACKS)
def test_victim_latency_within_goal_of_a_fair_neighbour(
    run: dict[str, Scenario], attack: str
) -> None:
    fair, attacked = run["fair"].figures(), run[attack].figures()
    assert attacked["complete"] == attacked["requests"] == Plan().victim_requests, _summary(
        run, attack
    )
    for key in ("ttft_p50_ms", "itl_p50_ms"):
        assert attacked[key] <= GOAL_RATIO * fair[key], (key, _summary(run, attack))


@pytest.mark.parametrize("attack", ATTACKS)
def test_victim_is_never_preempted(run: dict[str, Scenario], attack: str) -> None:
    preempted = run[attack].victim_preemptions
    assert preempted is not None, "no cloister_tenant_preemptions_suffered series for the victim"
    assert preempted == 0, _summary(run, attack)


@pytest.mark.parametrize("attack", ["flood", "both"])
def test_cached_prefix_survives_the_flood(run: dict[str, Scenario], attack: str) -> None:
    figures = run[attack].figures()
    assert figures["cached_after_flood"] is not None, "the victim's check request failed"
    assert figures["cached_after_flood"] > 0, figures
    # Nor did any of its timed requests under the attack miss its cached prefix.
    assert all(n for n in figures["cached_tokens"]), figures


@pytest.mark.parametrize("attack", ATTACKS)
def test_attacker_gets_clear_4xx_and_no_5xx(run: dict[str, Scenario], attack: str) -> None:
    scenario = run[attack]
    found: list[str] = scenario.attacker_problems()
    if attack in ("fill", "both"):
        statuses: dict[str, Any] = {r.what: r.status for r in scenario.probes}
        assert len(statuses) == 3, statuses
    assert found == [], "\n".join(found)
