"""`cloister reuse-replay` on crafted samples whose reuse is known by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cloister.cli import main
from engine.planning.reuse import TrafficRecord, TrafficSampleError, parse_sample, replay_reuse
from tests.utils.tiny_model import make_tiny_model_dir

BS = 4
SYSTEM = list(range(100, 108))  # two blocks every request starts with


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _crafted() -> list[dict[str, object]]:
    """Tenants a and b each send the same 8-token system prompt, then a 4-token suffix.

    In arrival order: a1 (nothing cached), b1 (a's blocks: shared only), a2 (2 blocks),
    b2 (2 blocks). Within tenants: a2 and b2 reuse 8 tokens each = 16 of 48. In one
    shared domain, b1 reuses a1's 8 tokens too = 24 of 48.
    """
    return [
        {"tenant": "a", "timestamp": 0.0, "token_ids": [*SYSTEM, 1, 2, 3, 4]},
        {"tenant": "b", "timestamp": 1.0, "token_ids": [*SYSTEM, 5, 6, 7, 8]},
        {"tenant": "a", "timestamp": "1970-01-01T00:00:02+00:00", "token_ids": [*SYSTEM, 9, 9, 9, 9]},
        {"tenant": "b", "timestamp": 3.0, "token_ids": [*SYSTEM, 7, 7, 7, 7]},
    ]  # fmt: skip


def test_within_tenants_and_shared(tmp_path: Path) -> None:
    sample = _write(tmp_path / "s.jsonl", _crafted())
    out = CliRunner().invoke(main, ["reuse-replay", str(sample), "--block-size", "4", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    within, shared = result["within_tenants"], result["shared_domain"]
    assert (within["shared_tokens"], within["input_tokens"]) == (16, 48)
    assert within["reuse_fraction"] == pytest.approx(1 / 3)
    assert within["per_tenant"]["a"]["shared_tokens"] == 8
    assert (shared["shared_tokens"], shared["input_tokens"]) == (24, 48)


def test_the_last_token_is_never_counted_and_blocks_are_whole() -> None:
    # The same 8 tokens twice: the engine must compute the last token, so only 1 block.
    same = [TrafficRecord("a", float(t), tuple(SYSTEM)) for t in range(2)]
    assert replay_reuse(same, block_size=BS).shared_tokens == 4
    # A 6-token repeat: one whole block, never the partial one.
    six = [TrafficRecord("a", float(t), tuple(SYSTEM[:6])) for t in range(2)]
    assert replay_reuse(six, block_size=BS).shared_tokens == 4


def test_arrival_order_not_file_order() -> None:
    rows = list(parse_sample((json.dumps(r).encode() for r in _crafted()[::-1]), None))
    report = replay_reuse(rows, block_size=BS)
    assert report.shared_tokens == 16


def test_window_and_kv_budget_limit_the_bound() -> None:
    rows = [TrafficRecord("a", t, (*SYSTEM, 1, 2, 3, 4)) for t in (0.0, 10.0, 100.0)]
    assert replay_reuse(rows, block_size=BS).shared_tokens == 16  # 8 + 8
    # Blocks idle for over 50 s are gone: the third request finds nothing.
    assert replay_reuse(rows, block_size=BS, window_s=50).shared_tokens == 8
    # Two tenants alternating over a budget of 3 blocks evict each other's chains.
    alt = [TrafficRecord(t, float(i), tuple(SYSTEM)) for i, t in enumerate("abab")]
    assert replay_reuse(alt, block_size=BS).shared_tokens == 8
    assert replay_reuse(alt, block_size=BS, kv_budget_tokens=12).shared_tokens == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "line 1: not JSON"),
        (b"[1, 2]", "line 1: a JSON object is expected"),
        (b'{"timestamp": 1, "token_ids": [1]}', "'tenant' must be"),
        (b'{"tenant": "a", "timestamp": "yesterday", "token_ids": [1]}', "not ISO 8601"),
        (b'{"tenant": "a", "timestamp": 1, "token_ids": [-1]}', "non-negative integers"),
        (b'{"tenant": "a", "timestamp": 1, "token_ids": []}', "the prompt is empty"),
        (b'{"tenant": "a", "timestamp": 1}', "give 'token_ids' or a 'prompt'"),
        (b'{"tenant": "a", "timestamp": NaN, "token_ids": [1]}', "must be finite"),
    ],
)
def test_bad_lines_name_the_line(line: bytes, message: str, tmp_path: Path) -> None:
    with pytest.raises(TrafficSampleError, match=message):
        list(parse_sample([line], None))
    sample = tmp_path / "bad.jsonl"
    sample.write_bytes(line + b"\n")
    out = CliRunner().invoke(main, ["reuse-replay", str(sample)])
    assert out.exit_code != 0 and message in out.output and "Traceback" not in out.output


def test_the_engine_observes_what_the_bound_allows(tmp_path: Path) -> None:
    """Replayed through a tiny engine with the same block size, the hit rate is the bound."""
    model = make_tiny_model_dir(tmp_path / "model")
    rows = _crafted()
    rows.append({"tenant": "a", "timestamp": 4.0, "prompt": "hello there, general cache"})
    sample = _write(tmp_path / "s.jsonl", rows)
    args = ["reuse-replay", str(sample), "--model", str(model), "--block-size", "4"]
    out = CliRunner().invoke(main, [*args, "--engine", "--json"])
    assert out.exit_code == 0, out.output
    assert "replaying" in out.stderr  # the progress bar, kept off stdout
    result = json.loads(out.stdout)
    assert result["engine"]["shared_tokens"] == result["within_tenants"]["shared_tokens"] == 16
    assert result["engine"]["vs_bound"] == pytest.approx(1.0)
