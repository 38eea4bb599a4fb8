"""The new model families served by `cloister serve --model NAME=PATH`, live over HTTP.

Tiny random-weight folders saved by transformers itself (Qwen3, Phi-3, a Mistral
with a sliding window, a Mixtral (a mixture of experts), a Gemma 3, a Gemma 2 (soft-capped
attention), a Phi-4-mini shape (partial rotary, LongRoPE) and a Llama packed as a GPTQ
checkpoint) run in one real `build_app`,
served by uvicorn, and are used with the openai SDK: each answers, tenants keep their
own caches, the registry records each one's family and storage type, the start-up
summary names them, and the Mistral serves prompts longer than its window.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import OpenAI

from assembly.startup_summary import build_summary
from server.settings import Settings
from tests.admin.zip_archives import zip_of
from tests.utils.built_app import admin_secret, migrated_sessions, tenant_keys
from tests.utils.hf_families import make_family_dir
from tests.utils.int_checkpoints import Layout, make_int_folder
from tests.utils.lora_adapters import make_peft_adapter
from tests.utils.served_app import served_app, served_models_settings

pytestmark = pytest.mark.slow

WINDOW = 64
# A Mistral-style template: tools in [AVAILABLE_TOOLS], calls after [TOOL_CALLS].
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{% endif %}{% for m in messages %}{% if m['role'] == 'user' %}[INST]{{ m['content'] }}"
    "[/INST]{% elif m['role'] == 'assistant' %}{% if m.tool_calls %}[TOOL_CALLS]"
    "{{ m.tool_calls | tojson }}{% else %}{{ m['content'] }}{% endif %}</s>"
    "{% elif m['role'] == 'tool' %}[TOOL_RESULTS]{{ m['content'] }}[/TOOL_RESULTS]"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)
# Gemma's chat template has no system role: it raises on one, as Gemma 2's does.
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Phi-4-mini's rotary: over 3/4 of each head, LongRoPE past 32 positions (its own
# boundary is 4096; the prompts here cross this one).
PHI4_MINI: dict[str, Any] = {
    "max_position_embeddings": 512,
    "original_max_position_embeddings": 32,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.2, 1.5, 1.7, 2.0, 2.5],
        "long_factor": [4.0, 6.0, 9.0, 12.0, 16.0, 20.0],
    },
}
PROMPT = "Tell me about the mountains near the lake, the river and the old town."


@dataclass
class Served:
    """The running server: its URL, two tenants' keys, an admin token, the app."""

    base_url: str
    keys: tuple[str, str]
    admin: str
    app: Any
    settings: Settings

    def client(self, tenant: int = 0) -> OpenAI:
        """An openai SDK client with one tenant's key."""
        return OpenAI(
            base_url=self.base_url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120
        )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("families")
    qwen3 = make_family_dir(tmp / "models", "qwen3", seed=1)
    # A Qwen3 chat template writes thinking blocks; this one says so in a comment, which
    # is what `reasoning_parser=auto` looks for (the rest stays SmolLM2's template).
    template = qwen3 / "chat_template.jinja"
    template.write_text("{#- thinking models: <think>...</think> #}" + template.read_text())
    phi3 = make_family_dir(tmp / "models", "phi3", seed=2)
    mistral = make_family_dir(tmp / "models", "mistral", seed=3, sliding_window=WINDOW)
    (mistral / "chat_template.jinja").write_text(MISTRAL_TEMPLATE)
    mixtral = make_family_dir(tmp / "models", "mixtral", seed=4)
    gemma = make_family_dir(tmp / "models", "gemma3", seed=5)
    (gemma / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
    gptq, _ = make_int_folder(tmp / "models", "llama", Layout("gptq"))
    gemma2 = make_family_dir(tmp / "models", "gemma2", seed=6)
    (gemma2 / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
    phi4 = make_family_dir(tmp / "models", "phi3", seed=7, **PHI4_MINI)
    models = [
        f"q3={qwen3}",
        f"phi={phi3}",
        f"mis={mistral}",
        f"mix={mixtral}",
        f"gem={gemma}",
        f"gq={gptq}",
        f"g2={gemma2}",
        f"p4={phi4}",
    ]
    settings = served_models_settings(tmp, models)
    sessions = migrated_sessions(settings)
    keys = tenant_keys(sessions, ("acme", "globex"))
    admin = admin_secret(sessions)
    with served_app(settings) as (url, app):
        yield Served(url, (keys["acme"], keys["globex"]), admin, app, settings)


def _chat(served: Served, model: str, tenant: int = 0) -> tuple[str, int]:
    """A greedy chat completion's text and its cached prompt tokens."""
    done = served.client(tenant).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
    )
    assert done.model == model and done.usage is not None
    assert done.usage.completion_tokens == 6
    details = done.usage.prompt_tokens_details
    return done.choices[0].message.content or "", (details.cached_tokens or 0) if details else 0


@pytest.mark.parametrize("model", ["q3", "phi", "mis", "mix", "gem", "gq", "g2", "p4"])
def test_each_family_answers_and_keeps_each_tenants_cache_its_own(
    served: Served, model: str
) -> None:
    text, cold = _chat(served, model, tenant=0)
    again, warm = _chat(served, model, tenant=0)
    other, theirs = _chat(served, model, tenant=1)
    assert cold == 0 and warm >= 16  # the same tenant hits its own cache
    assert theirs == 0  # the other tenant's first request finds nothing of acme's
    assert again == text == other  # greedy: the cache changes nothing in the answer


def test_the_registry_records_family_and_storage(served: Served) -> None:
    r = httpx.get(
        served.base_url + "/admin/api/v1/models",
        headers={"Authorization": f"Bearer {served.admin}"},
        timeout=30,
    )
    assert r.status_code == 200
    rows = {m["name"]: m for m in r.json()["items"]}
    assert {n: (rows[n]["family"], rows[n]["quantization"]) for n in rows} == {
        "q3": ("qwen3", "F32"),
        "phi": ("phi3", "F32"),
        "mis": ("mistral", "F32"),
        "mix": ("mixtral", "F32"),
        "gem": ("gemma3", "F32"),
        "gq": ("llama", "GPTQ 4-bit g32"),
        "g2": ("gemma2", "F32"),
        "p4": ("phi3", "F32"),
    }
    assert rows["mis"]["context_length"] == 256  # the served context, not the window


def test_the_startup_summary_names_family_storage_and_window(served: Served) -> None:
    engines = served.app.state.cloister.engines
    text = build_summary(served.settings, engines, {"device": "cpu"}).text()
    assert "q3  (qwen3, F32; context 256;" in text
    assert "phi  (phi3, F32; context 256;" in text
    assert (
        f"mis  (mistral, F32, sliding window {WINDOW} on 2 layers (blocks behind it freed); "
        "context 256;" in text
    )
    assert "mix  (mixtral, F32, 4 experts, 2 per token; context 256;" in text
    assert "gq  (llama, GPTQ 4-bit g32; context 256;" in text


def test_a_prompt_longer_than_the_window_is_served(served: Served) -> None:
    """The window layers see their last 64 positions; the context is the model's."""
    prompt = PROMPT * 9  # well past 64 tokens
    done = served.client().completions.create(model="mis", prompt=prompt, max_tokens=4)
    assert done.usage is not None and done.usage.prompt_tokens > 2 * WINDOW
    assert done.usage.completion_tokens == 4
    # A prompt past the context itself is still a clear 400.
    with pytest.raises(openai.BadRequestError) as refused:
        served.client().completions.create(model="mis", prompt=PROMPT * 30, max_tokens=4)
    body = refused.value.body
    assert isinstance(body, dict) and "context" in str(body.get("message"))


def test_a_lora_upload_for_the_mixture_of_experts_is_a_clear_400(
    served: Served, tmp_path: Path
) -> None:
    paths = {s.name: s.path or "" for s in served.settings.served_models}

    def upload(name: str, base: str) -> httpx.Response:
        # An adapter of the attention's q projection: a shape every decoder here takes.
        adapter = make_peft_adapter(
            tmp_path / name, paths[base], rank=4, alpha=8, targets=["q_proj"]
        )
        return httpx.post(
            served.base_url + "/admin/api/v1/adapters/upload",
            params={"name": name, "base_model": base},
            content=zip_of({p.name: p.read_bytes() for p in adapter.iterdir()}),
            headers={"Authorization": f"Bearer {served.admin}"},
            timeout=60,
        )

    refused = upload("mix-lora", "mix")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert "not supported on mixture-of-experts models (mixtral)" in error["message"]
    assert error["type"] == "invalid_request_error"
    # The same adapter on the dense Mistral of the same server is accepted.
    accepted = upload("mis-lora", "mis")
    assert accepted.status_code == 201, accepted.text


# The test forces a thinking block out of random weights with a regular expression.
THINKING = {"guided_regex": "<think>[a-z ]{4,24}</think>\n\n[a-z ]{2,16}"}


def _think(served: Served, model: str, max_tokens: int, **options: Any) -> Any:
    """A greedy chat completion of "Hi", made to write a thinking block first."""
    messages: Any = [{"role": "user", "content": "Hi"}]
    return served.client().chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        extra_body=THINKING,
        **options,
    )


def test_qwen3_thinking_is_returned_apart_from_the_answer(served: Served) -> None:
    done = _think(served, "q3", 60)
    message = done.choices[0].message
    thought = message.model_extra["reasoning_content"] if message.model_extra else None
    assert isinstance(thought, str) and 4 <= len(thought) <= 24
    assert (
        message.content and "<think>" not in message.content and "</think>" not in message.content
    )
    assert done.usage is not None and done.usage.completion_tokens > 0
    # Streamed: the same split, thinking first, as deltas of their own.
    stream = _think(served, "q3", 60, stream=True)
    thinking, answer, order = [], [], []
    for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                thinking.append(extra["reasoning_content"])
                order.append("thinking")
            if choice.delta.content:
                answer.append(choice.delta.content)
                order.append("answer")
    assert "".join(thinking) == thought and "".join(answer) == message.content
    assert order == sorted(order, key=lambda kind: kind != "thinking")


def test_a_model_whose_template_does_not_think_keeps_its_text_as_content(
    served: Served,
) -> None:
    done = _think(served, "mis", 30)
    message = done.choices[0].message
    assert not (message.model_extra or {}).get("reasoning_content")
    assert message.content is not None and message.content.startswith("<think>")


@pytest.mark.parametrize("model", ["gem", "g2"])
def test_gemma_takes_a_system_message_folded_into_the_first_turn(
    served: Served, model: str
) -> None:
    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        done = served.client().chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=2,
            temperature=0,  # type: ignore[arg-type]
        )
        assert done.usage is not None
        return done.usage.prompt_tokens

    plain = prompt_tokens([{"role": "user", "content": "Hi"}])
    system = {"role": "system", "content": "You answer in one short sentence."}
    folded = prompt_tokens([system, {"role": "user", "content": "Hi"}])
    assert folded > plain + 5  # the system text is in the prompt, in the first turn
    # A conversation the template refuses for another reason is still a clear 400.
    with pytest.raises(openai.BadRequestError) as refused:
        served.client().chat.completions.create(
            model=model,
            messages=[{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}],
            max_tokens=2,
        )
    assert "alternate" in str(refused.value)


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "maxLength": 8}},
            "required": ["tz"],
        },
    },
}


def _ask_time(served: Served, **options: Any) -> Any:
    """A greedy chat completion on "mis" that must call TIME_TOOL."""
    messages: Any = [{"role": "user", "content": "What time is it in Paris?"}]
    tools: Any = [TIME_TOOL]
    return served.client().chat.completions.create(
        model="mis",
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=40,
        temperature=0,
        **options,
    )


def test_mistral_tool_calls_come_back_as_tool_calls(served: Served) -> None:
    """The template says [TOOL_CALLS]: the call is written and parsed in Mistral's format."""
    from gateway.tools import detect_parser

    assert detect_parser(MISTRAL_TEMPLATE) == "mistral"  # the format this server picked
    done = _ask_time(served)
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_time"
    assert set(json.loads(call.function.arguments)) == {"tz"}
    assert not choice.message.content
    # Streamed, the same call arrives as tool-call deltas.
    stream = _ask_time(served, stream=True)
    names, arguments = [], []
    for chunk in stream:
        for part in chunk.choices:
            for delta in part.delta.tool_calls or []:
                if delta.function and delta.function.name:
                    names.append(delta.function.name)
                if delta.function and delta.function.arguments:
                    arguments.append(delta.function.arguments)
    assert names == ["get_time"] and "".join(arguments) == call.function.arguments
