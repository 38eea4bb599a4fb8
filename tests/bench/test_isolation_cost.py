"""bench/isolation_cost.py: a quick run on a tiny model serves every request and its
cache hits follow the isolation rules of each configuration."""

from __future__ import annotations

from typing import Any

import pytest

from bench.isolation_cost import main, order_of, parse_args, round_ratio
from bench.isolation_workload import encode_chat, user_header_prefix
from engine.model.tokenizer import load_hf_tokenizer
from tests.utils.bench_runs import run_bench_main
from tests.utils.tiny_model import make_tiny_model_dir, smollm2_tokenizer_dir


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The quick benchmark's last printed line, parsed."""
    model = make_tiny_model_dir(tmp_path_factory.mktemp("isolation-cost"))
    capture = tmp_path_factory.mktemp("out") / "stdout.txt"
    argv = ["--quick", "--details", "--no-progress", "--model", str(model)]
    parsed, lines = run_bench_main(main, argv, capture)
    assert any(line.startswith("published vs shared ttft p50") for line in lines)
    return parsed


def _by_tenant_first(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    firsts: dict[int, dict[str, Any]] = {}
    for r in sorted(records, key=lambda r: r["submitted"]):
        firsts.setdefault(r["tenant"], r)
    return firsts


@pytest.mark.slow
def test_every_configuration_serves_every_request(report: dict[str, Any]) -> None:
    n = report["workload"]["requests_per_run"]
    assert n == 4 * 2 * 2
    for name in ("shared", "isolated", "published"):
        figures = report["configs"][name]
        assert figures["requests"] == figures["expected_requests"] == n
        assert figures["errors"] == 0
        assert sorted(r["index"] for r in report["records"][name]) == list(range(n))
        assert figures["ttft_p50_s"] > 0 and figures["ttft_p95_s"] >= figures["ttft_p50_s"]
    ratio = report["published_vs_shared_ttft_p50_ratio"]
    (published,) = report["configs"]["published"]["ttft_p50_by_repeat_s"]
    (shared,) = report["configs"]["shared"]["ttft_p50_by_repeat_s"]
    assert ratio == pytest.approx(published / shared)  # one round: its own ratio
    assert report["pooled_published_vs_shared_ttft_p50_ratio"] == pytest.approx(
        report["configs"]["published"]["ttft_p50_s"] / report["configs"]["shared"]["ttft_p50_s"]
    )
    assert report["goal_met"] == (ratio < 1.05)


@pytest.mark.slow
def test_no_request_hits_more_than_its_domain_could_have_cached(report: dict[str, Any]) -> None:
    for name in ("shared", "isolated", "published"):
        (bound,) = report["replay_hits"][name]
        for r in report["records"][name]:
            assert r["cached_tokens"] <= bound[r["index"]], (name, r)


@pytest.mark.slow
def test_isolated_tenants_start_cold_and_published_ones_share_the_system_prompt(
    report: dict[str, Any],
) -> None:
    bs = report["workload"]["block_size"]
    published = report["workload"]["published_blocks"] * bs
    assert published > 0
    for r in _by_tenant_first(report["records"]["isolated"]).values():
        assert r["cached_tokens"] == 0  # another tenant's system prompt is not theirs
    for name in ("shared", "published"):
        records = sorted(report["records"][name], key=lambda r: r["submitted"])
        first = records[0]
        ready = first["sent_s"] + first["ttft_s"]  # its prefill had been cached by then
        late = [r for r in records if r["sent_s"] > ready]
        assert late, "every request came before the first prefill: nothing to check"
        for r in late:
            assert r["cached_tokens"] >= published, (name, r)


@pytest.mark.slow
def test_a_later_turn_hits_at_least_the_previous_prompt(report: dict[str, Any]) -> None:
    bs = report["workload"]["block_size"]
    turns = {t["index"]: t for t in report["turns"]}
    for name in ("shared", "isolated", "published"):
        records = {r["index"]: r for r in report["records"][name]}
        for index, r in records.items():
            previous = turns[index]["previous"]
            if previous is not None:
                full = records[previous]["prompt_tokens"] // bs * bs
                assert r["cached_tokens"] >= full, (name, r)


@pytest.mark.slow
def test_hit_rates_shared_and_published_above_isolated(report: dict[str, Any]) -> None:
    figures = report["configs"]
    shared, isolated, published = (figures[c] for c in ("shared", "isolated", "published"))
    assert shared["hit_rate"] > isolated["hit_rate"]
    assert published["hit_rate"] > isolated["hit_rate"]
    # Published shares only the system message's full blocks, the shared domain can also
    # share the block that straddles it (one per first turn); and one more first turn
    # may race the very first prefill.
    bs = report["workload"]["block_size"]
    first_turns = sum(1 for t in report["turns"] if t["turn"] == 0)
    slack = first_turns * bs + report["workload"]["system_message_tokens"]
    assert published["cached_tokens"] >= shared["cached_tokens"] - slack
    assert shared["prompt_tokens"] == isolated["prompt_tokens"] == published["prompt_tokens"]


@pytest.mark.parametrize(
    "argv", [["--tenants", "0"], ["--turns", "0"], ["--rate", "0"], ["--max-tokens", "-1"]]
)
def test_bad_flags_exit_with_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_round_ratio_cancels_a_linear_drift_in_the_mirrored_order() -> None:
    # Equal speeds, the machine 1.5x slower each run; ABC CBA puts shared at runs 0 and 5,
    # published at 2 and 3: the pooled ratio would be skewed, the round ratio is 1.
    slow = [1.5**k for k in range(6)]
    assert round_ratio([slow[2], slow[3]], [slow[0], slow[5]]) == pytest.approx(1.0)
    assert round_ratio([2.0, 2.0], [1.0, 1.0]) == pytest.approx(2.0)


def test_repeats_run_in_a_mirrored_order() -> None:
    assert order_of(2) == [
        ("shared", 0),
        ("isolated", 0),
        ("published", 0),
        ("published", 1),
        ("isolated", 1),
        ("shared", 1),
    ]


def test_the_published_prefix_is_the_system_message_and_the_user_header() -> None:
    tokenizer = load_hf_tokenizer(smollm2_tokenizer_dir())
    system = {"role": "system", "content": "Answer briefly."}
    system_ids = encode_chat(tokenizer, [system], generation=False)
    published = user_header_prefix(tokenizer, system)
    assert list(published[: len(system_ids)]) == system_ids
    assert tokenizer.decode(published[len(system_ids) :], skip_special_tokens=False) == (
        "<|im_start|>user\n"
    )
    chat = [system, {"role": "user", "content": "Hi"}]
    assert tuple(encode_chat(tokenizer, chat, generation=True)[: len(published)]) == published
