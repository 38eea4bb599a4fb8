"""The hostile-tenant suite's live `cloister serve`: its small capacity and settings, the
bystanders' prompts, the handles the suite uses, and a bystander's expected stream taken
while the server is quiet."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.processes import GatewayProcess
from tests.reliability.live import Bystander, Bystanders, bystander_body, stream_chat

MAX_NUM_SEQS = 8
MAX_WAITING = 8
AUTH_FAILURE_WINDOW_S = 3.0
MAX_N = 4  # with at most 3 prompts per fuzzed request, one request never fills the engine
SERVER_SETTINGS: dict[str, Any] = {
    "max_num_seqs": MAX_NUM_SEQS,
    "max_waiting": MAX_WAITING,
    "max_n": MAX_N,
    "max_model_len": 512,
    # Every client here shares 127.0.0.1, so the admin flood throttles the operator's own
    # address too; a short window lets the tests after it wait the throttle out.
    "auth_failure_window_s": AUTH_FAILURE_WINDOW_S,
}
BYSTANDER_PROMPTS = {
    "bystander-a": ("Tell me a story about a lighthouse keeper.", 24),
    "bystander-b": ("List three facts about rivers.", 16),
}


@dataclass(frozen=True)
class LiveServer:
    """The running server and the credentials the suite uses."""

    gw: GatewayProcess
    data_dir: Path
    model_dir: Path
    admin_token: str
    attacker_key: str
    bystanders: Bystanders
    # Replies the attacker got with 200, by request id: the usage they reported (None: the
    # reply carried none, e.g. a stream without include_usage). Checked against the ledger.
    attacker_ok: dict[str, dict[str, Any] | None] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:<port>."""
        return self.gw.base_url

    @property
    def db_path(self) -> Path:
        """The SQLite file the server serves from."""
        return self.data_dir / "cloister.db"


def quiet_bystander(base_url: str, name: str, key: str, prompt: str, max_tokens: int) -> Bystander:
    """A bystander whose expected text and usage come from two identical quiet runs."""
    body = bystander_body(prompt, max_tokens)
    with httpx.Client(base_url=base_url, timeout=120) as client:
        first, second = stream_chat(client, key, body), stream_chat(client, key, body)
    for run in (first, second):
        assert run.status == 200 and run.done and not run.errors, run.raw
        assert run.usage is not None, run.raw
    assert first.text == second.text, "greedy decoding is not reproducible on a quiet server"
    assert first.text, "the bystander's expected text is empty"
    assert first.usage is not None
    return Bystander(name, key, body, first.text, first.usage, results=[first, second])
