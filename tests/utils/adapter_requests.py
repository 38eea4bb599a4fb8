"""The LoRA adapter tests' app on the tiny model (in-process engine or engine servers),
and what they ask of it through the openai SDK."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from assembly.app import build_app
from server.settings import Settings
from tests.utils.built_app import alpha_beta_and_admin, close_app, migrated_sessions
from tests.utils.principals import PEPPER

# Token ids of the tiny model's vocabulary: the prompt every adapter test completes.
PROMPT = [1200, 4521, 877, 12, 9031, 77, 4242, 31337 % 49152]


@contextmanager
def tiny_adapter_app(data_dir: Path, model: Path, **settings: Any) -> Iterator[dict[str, Any]]:
    """The assembled app on the tiny model `model` (named "tiny"), started in a TestClient,
    with tenants "alpha" and "beta" and an admin; `settings` add to its Settings. Yields
    the client, "key_a", "key_b", the admin's "admin" headers and the "sessions"."""
    # Rows re-read every 0.2 s: an upload becomes servable well within the tests' 5 s.
    values: dict[str, Any] = {"config_refresh_s": 0.2, **settings}
    built = Settings(
        data_dir=data_dir, key_pepper=PEPPER, model=str(model), model_name="tiny", **values
    )
    sessions = migrated_sessions(built)
    key_a, key_b, admin = alpha_beta_and_admin(sessions)
    app = build_app(built)
    with TestClient(app) as client:
        yield {
            "client": client,
            "key_a": key_a,
            "key_b": key_b,
            "admin": {"Authorization": f"Bearer {admin}"},
            "sessions": sessions,
        }
    close_app(app)


def greedy_logprobs(sdk: openai.OpenAI, model: str, prompt: list[int]) -> list[float]:
    """The token logprobs of a greedy 4-token completion of `prompt` on `model`."""
    out = sdk.completions.create(
        model=model, prompt=prompt, max_tokens=4, temperature=0, logprobs=1
    )
    assert out.choices[0].logprobs is not None
    return list(out.choices[0].logprobs.token_logprobs or [])


def assert_hidden(sdk: openai.OpenAI, adapter: str, unknown: str, prompt: list[int]) -> None:
    """Asserts that `sdk`'s tenant neither lists `adapter` nor can use it, and that its
    404 is the one an `unknown` name gets (no hint that the adapter exists)."""
    assert adapter not in {m.id for m in sdk.models.list()}
    with pytest.raises(openai.NotFoundError) as forbidden:
        sdk.completions.create(model=adapter, prompt=prompt, max_tokens=2)
    with pytest.raises(openai.NotFoundError) as unknown_name:
        sdk.completions.create(model=unknown, prompt=prompt, max_tokens=2)
    assert forbidden.value.body["code"] == unknown_name.value.body["code"] == "model_not_found"  # type: ignore[index]
