"""LiteLLM's proxy as the gateway benchmark's peer, in front of the floor app.

LiteLLM is not a dependency of Cloister: it is installed into a virtual
environment of its own (its pins would fight ours), for example

    python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'

and its `litellm` command is handed to bench/gateway_overhead.py with `--litellm`.
The proxy runs with a master key and one model routed to the floor's OpenAI
endpoint (bench/floor_gateway.py), so what it adds above the floor is its own cost:
HTTP in, its authentication and routing, an HTTP call out. It runs no rate
limiter (that needs LiteLLM's database), so it does less per request than
Cloister's gateway does.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.utils.services import free_port, stop_process, wait_http_ok

START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class LiteLLMProxy:
    """A running LiteLLM proxy."""

    base_url: str
    pid: int
    key: str


def proxy_config(model_name: str, upstream_url: str, master_key: str) -> str:
    """LiteLLM's YAML config: one OpenAI-compatible model at `upstream_url`."""
    return (
        "model_list:\n"
        f"  - model_name: {model_name}\n"
        "    litellm_params:\n"
        f"      model: openai/{model_name}\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: none\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )


@contextmanager
def litellm_proxy(
    executable: str, model_name: str, upstream_url: str, work_dir: Path
) -> Iterator[LiteLLMProxy]:
    """Starts `executable` (LiteLLM's CLI) on a free port; stops it on exit."""
    key = f"sk-bench-{secrets.token_hex(8)}"
    config = work_dir / "litellm.yaml"
    config.write_text(proxy_config(model_name, upstream_url, key))
    port = free_port()
    log_path = work_dir / "litellm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [executable, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(proc, base_url + "/health/liveliness", log_path, START_TIMEOUT_S, "LiteLLM")
        yield LiteLLMProxy(base_url, proc.pid, key)
    finally:
        stop_process(proc)
