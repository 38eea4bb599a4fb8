"""Per-tenant cache policy and published prefixes, end to end on a live gateway.

The app is the real `build_app` wiring (admin API, CacheRulesSync in the lifespan) over
the real AsyncEngine on a tiny random-weight model with a small KV pool. Changes go in
through the admin API over HTTP; their effect is read from `cached_tokens` in the
openai SDK's usage.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.identity import create_admin_token
from assembly.app import build_app
from assembly.cache_rules_sync import CacheRulesSync
from engine.fronts.async_engine import AsyncEngine
from server.logging_setup import configure_logging
from server.settings import Settings
from tenancy import store
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.utils.live_gateway import serve_in_thread
from tests.utils.principals import PEPPER
from tests.utils.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.slow

BLOCK = 16
NUM_BLOCKS = 48  # 768 tokens: one flood of the other tenant's prompts overflows it
REFRESH_S = 0.5
EFFECT_BOUND_S = 5.0 + REFRESH_S  # the 5 s, plus one refresh period
P = "/admin/api/v1"


@dataclass
class PolicyGateway:
    """A live `cloister serve`-style app and the handles the tests use."""

    base_url: str
    sessions: sessionmaker[Session]
    admin_headers: dict[str, str]
    sync: CacheRulesSync
    tokenizer: Any
    model: str = "tiny"

    def client(self, key: str) -> OpenAI:
        """An OpenAI SDK client with this key and no retries."""
        return OpenAI(base_url=self.base_url + "/v1", api_key=key, max_retries=0, timeout=120)

    def tenant(self, name: str) -> tuple[str, str]:
        """(tenant id, key secret) of a new tenant (set-up, not under test)."""
        with self.sessions() as s:
            tid = store.create_tenant(s, name=name).id
            return tid, store.create_key(s, tenant_name=name, pepper=PEPPER).secret

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One admin API call over HTTP with an admin token."""
        return httpx.request(
            method, self.base_url + P + path, headers=self.admin_headers, timeout=30, **kwargs
        )

    def cached(self, key: str, messages: list[dict[str, str]]) -> int:
        """cached_tokens of one greedy one-token chat completion."""
        out = self.client(key).chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=1,
            temperature=0,  # type: ignore[arg-type]
        )
        assert out.usage is not None and out.usage.prompt_tokens_details is not None
        return int(out.usage.prompt_tokens_details.cached_tokens or 0)

    def wait_pushed(self, check: Any) -> float:
        """Seconds until the engine accepted rules for which `check(rules)` holds."""
        start = time.monotonic()
        while True:
            rules = self.sync.last_pushed
            if rules is not None and check(rules):
                return time.monotonic() - start
            assert time.monotonic() - start < EFFECT_BOUND_S, rules
            time.sleep(0.05)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PolicyGateway]:
    tmp = tmp_path_factory.mktemp("cache-policy")
    url = f"sqlite:///{tmp / 'cloister.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    folder = make_tiny_model_dir(tmp / "models")
    with sessions() as s:
        admin = create_admin_token(s, pepper=PEPPER, role="admin").secret
        registry.register_model(
            s, name="tiny", source=str(folder), format="safetensors", context_length=1024
        )
    settings = Settings(
        data_dir=tmp,
        key_pepper=PEPPER,
        database_url=url,
        config_refresh_s=REFRESH_S,
        model_name="tiny",
        log_level="WARNING",
    )
    engine = AsyncEngine.from_options(
        model=str(folder),
        max_model_len=1024,
        num_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        attention_backend="torch",
        # The explicit floor is under test: no default flood floor for the control tenant.
        fair_cached_share=0.0,
    )
    app = build_app(settings, engine=engine)
    handler = configure_logging("WARNING", stream=io.StringIO())
    url, stop = serve_in_thread(app, start_timeout_s=120, stop_timeout_s=60)
    yield PolicyGateway(
        url,
        sessions,
        {"Authorization": f"Bearer {admin}"},
        app.state.cache_rules_syncs[settings.model_name],
        engine.tokenizer,
    )
    stop()
    for writer in app.state.background_writers:
        writer.close()
    app.state.metering.close()
    logging.getLogger().removeHandler(handler)


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_floor_set_through_the_admin_api_survives_another_tenants_flood(
    gateway: PolicyGateway,
) -> None:
    a_id, a = gateway.tenant("floored")
    _, control = gateway.tenant("control")  # the same traffic, no floor
    _, b = gateway.tenant("flooder")
    r = gateway.admin("PATCH", "/tenants/floored", json={"cache_floor_blocks": 12})
    assert r.status_code == 200 and r.json()["cache_floor_blocks"] == 12, r.text
    took = gateway.wait_pushed(lambda rules: f"t:{a_id}" in dict(rules.domains))
    assert took <= EFFECT_BOUND_S

    mine = _user("Remember the quarterly figures for the north region: " + "ledger " * 40)
    assert gateway.cached(a, mine) == 0
    assert gateway.cached(control, mine) == 0
    # The flood: distinct long prompts, several times the pool, all of tenant B.
    for i in range(10):
        gateway.cached(b, _user(f"flood {i}: " + f"noise{i} " * 120))
    assert gateway.cached(control, mine) == 0  # flushed: what the floor prevents
    assert gateway.cached(a, mine) > 0


def test_never_cache_takes_effect_within_5_s_over_http(gateway: PolicyGateway) -> None:
    _, key = gateway.tenant("shy")
    prompt = _user("A prompt that is long enough to fill a block or two. " * 4)
    gateway.cached(key, prompt)
    assert gateway.cached(key, prompt) > 0
    r = gateway.admin("PATCH", "/tenants/shy", json={"never_cache": True})
    assert r.status_code == 200 and r.json()["never_cache"] is True, r.text
    start = time.monotonic()
    while gateway.cached(key, prompt) > 0:
        assert time.monotonic() - start < EFFECT_BOUND_S, "never_cache not in force in time"
        time.sleep(0.1)
    for _ in range(3):  # and it stays off: nothing was written for the repeats either
        assert gateway.cached(key, prompt) == 0


def test_published_prefix_is_shared_and_private_parts_stay_private(
    gateway: PolicyGateway,
) -> None:
    _, a = gateway.tenant("pub-a")
    _, b = gateway.tenant("pub-b")
    _, late = gateway.tenant("pub-late")
    system = {
        "role": "system",
        "content": "You are the support assistant of Example Corp. " * 6,
    }
    text = gateway.tokenizer.apply_chat_template([system], add_generation_prompt=False)
    ids = gateway.tokenizer.encode(text, add_special_tokens=False)
    published_full = len(ids) // BLOCK * BLOCK
    assert published_full >= 2 * BLOCK
    r = gateway.admin("POST", "/prefixes", json={"name": "support", "model": "tiny", "text": text})
    assert r.status_code == 201, r.text
    gateway.wait_pushed(lambda rules: tuple(ids) in rules.published)

    a_private = [system, {"role": "user", "content": "My account number is 4417 " * 8}]
    b_private = [system, {"role": "user", "content": "Where is my parcel 9921? " * 8}]
    first_a = gateway.cached(a, a_private)
    # The first request computes the published blocks (an engine may also warm them).
    assert first_a in (0, published_full)
    assert gateway.cached(b, b_private) == published_full  # exactly the published part
    assert gateway.cached(a, a_private) > published_full  # A's own cache, past it
    # B sending A's whole conversation gets the published part and not one block more.
    assert gateway.cached(b, a_private) == published_full
    assert gateway.cached(late, b_private) == published_full

    r = gateway.admin("DELETE", "/prefixes/support")
    assert r.status_code == 200, r.text
    gateway.wait_pushed(lambda rules: tuple(ids) not in rules.published)
    _, fresh = gateway.tenant("pub-fresh")
    other = [system, {"role": "user", "content": "A brand new question about invoices. " * 6}]
    assert gateway.cached(fresh, other) == 0
    assert gateway.cached(b, other) == 0


def test_kv_quota_set_over_http_refuses_what_can_never_fit(gateway: PolicyGateway) -> None:
    """A quota of 4 blocks (64 tokens): a request whose prompt + max_tokens needs more is
    a 400 that names the quota, for that tenant only; one that fits is served."""
    capped_id, capped = gateway.tenant("kv-capped")
    _, free = gateway.tenant("kv-free")
    r = gateway.admin("PATCH", "/tenants/kv-capped", json={"kv_quota_blocks": 4})
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] == 4, r.text
    root = f"t:{capped_id}"
    gateway.wait_pushed(
        lambda rules: getattr(rules.rule_map().get(root), "kv_quota_blocks", 0) == 4
    )
    short = _user("hi")
    too_long = {"model": gateway.model, "messages": short, "max_tokens": 4 * BLOCK + 16}
    with pytest.raises(openai.BadRequestError) as refused:
        gateway.client(capped).chat.completions.create(**too_long)  # type: ignore[call-overload]
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict) and error["type"] == "invalid_request_error", error
    assert "quota" in error["message"] and "4 blocks" in error["message"], error
    # The same request of a tenant without a quota is served; a small one of the capped
    # tenant too.
    out = gateway.client(free).chat.completions.create(**too_long)  # type: ignore[call-overload]
    assert out.choices[0].message is not None
    assert gateway.cached(capped, short) >= 0
    # Cleared over HTTP, the capped tenant's long request is served again.
    r = gateway.admin("PATCH", "/tenants/kv-capped", json={"kv_quota_blocks": None})
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] is None, r.text
    gateway.wait_pushed(lambda rules: root not in rules.rule_map())
    out = gateway.client(capped).chat.completions.create(**too_long)  # type: ignore[call-overload]
    assert out.choices[0].message is not None


def test_kv_quota_over_the_engine_pool_is_refused_over_http(gateway: PolicyGateway) -> None:
    gateway.tenant("kv-pool")
    for path in ("/tenants/kv-pool", "/tenants/kv-pool/settings"):
        r = gateway.admin("PATCH", path, json={"kv_quota_blocks": NUM_BLOCKS + 1})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error", r.text
        assert "kv_quota_blocks" in error["message"], r.text
        assert f"{NUM_BLOCKS} blocks" in error["message"], r.text
    r = gateway.admin("PATCH", "/tenants/kv-pool", json={"kv_quota_blocks": NUM_BLOCKS})
    assert r.status_code == 200 and r.json()["kv_quota_blocks"] == NUM_BLOCKS, r.text
