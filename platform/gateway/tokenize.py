"""Prompt tokenization that no tenant can use to stall the others.

Three rules, in order:

1. Size first. A prompt of more than `max_model_len * MAX_CHARS_PER_TOKEN`
   characters cannot fit the context, so it is refused (400
   context_length_exceeded) before any tokenizer work.
2. Off the event loop. A prompt costing more than `INLINE_CHARS` (its characters,
   plus `MESSAGE_COST_CHARS` per chat message for the template's Python loop) is
   templated and encoded on a small worker pool (the Rust tokenizer releases the
   GIL), so the loop keeps serving every other request meanwhile. Short prompts
   stay inline: a thread hop costs more than encoding them.
3. Per tenant. Each tenant has at most `PER_TENANT_RUNNING` prompts on the pool
   and `PER_TENANT_WAITING` queued behind them; more is a 429 (concurrency). So
   a flood of large prompts occupies at most one worker and delays only the
   tenant that sent it, while the pool has a worker free for everyone else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import ContextLengthExceededError
from engine_hop.client import EngineClient, TokenizerLike
from gateway.errors import InvalidParameterError
from tenancy.errors import RateLimitedError

# No tokenizer we serve averages anywhere near this many characters per token over a
# prompt (English text is ~4; the longest single vocabulary entries are ~80), so the
# bound never refuses a prompt that fits, and it stops absurd sizes before any work.
MAX_CHARS_PER_TOKEN = 64
INLINE_CHARS = 16_384  # below this, encoding takes well under a millisecond
MESSAGE_COST_CHARS = 256  # what rendering one chat message costs, in characters encoded
WORKERS = 2
PER_TENANT_RUNNING = 1
PER_TENANT_WAITING = 8

T = TypeVar("T")


def check_prompt_size(chars: int, *, max_model_len: int, param: str) -> None:
    """Refuses a prompt too long to fit the context whatever it tokenizes to."""
    limit = max_model_len * MAX_CHARS_PER_TOKEN
    if chars > limit:
        raise ContextLengthExceededError(
            f"the prompt has {chars} characters; this model's context of {max_model_len} "
            f"tokens takes at most {limit}",
            param=param,
        )


@dataclass
class _TenantGate:
    """One tenant's share of the pool: a slot semaphore and how many hold or want it."""

    slots: asyncio.Semaphore
    users: int = 0


class ModelPrompts:
    """One model's prompts: its tokenizer and context, the gateway's shared pool and gates."""

    def __init__(self, owner: PromptTokenizer, engine: EngineClient) -> None:
        self._owner = owner
        self._engine = engine  # read at call time: the tokenizer may come with the engine

    @property
    def tokenizer(self) -> TokenizerLike:
        """The model's tokenizer."""
        return self._engine.tokenizer

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template (None: it has none)."""
        template: str | None = getattr(self.tokenizer, "chat_template", None)
        return template

    def check_size(self, chars: int, *, param: str) -> None:
        """`check_prompt_size` against this model's context."""
        check_prompt_size(chars, max_model_len=self._engine.max_model_len, param=param)

    async def encode(
        self, tenant_id: str, text: str, *, add_special_tokens: bool = True, param: str = "prompt"
    ) -> list[int]:
        """Token ids of `text` (size-checked; large texts on the pool)."""
        self.check_size(len(text), param=param)
        return await self._owner.run(
            tenant_id, len(text), lambda: self.tokenizer.encode(text, add_special_tokens)
        )

    async def encode_chat(
        self,
        tenant_id: str,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of `messages` rendered with the chat template.

        The template already carries the model's BOS where it wants one. `tools` go to
        templates that render them (gateway.tools.prompting decides).
        """
        chars = sum(len(m.get("content") or "") for m in messages)
        chars += len(json.dumps(tools, ensure_ascii=False)) if tools else 0
        self.check_size(chars, param="messages")
        # The template loops over messages in Python: many empty ones cost as much as text.
        cost = chars + MESSAGE_COST_CHARS * len(messages)

        def render(conversation: list[dict[str, Any]]) -> str:
            if tools:
                return self.tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=True, tools=tools
                )
            return self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)

        def work() -> list[int]:
            try:
                text = render(messages)
            except Exception as exc:  # a template may reject a conversation shape (role order)
                folded = fold_system_messages(messages)
                if folded is None:
                    raise InvalidParameterError(f"messages: {exc}", param="messages") from None
                try:  # a template with no system role (Gemma): the system text goes first
                    text = render(folded)
                except Exception:
                    raise InvalidParameterError(f"messages: {exc}", param="messages") from None
            self.check_size(len(text), param="messages")
            return self.tokenizer.encode(text, add_special_tokens=False)

        return await self._owner.run(tenant_id, cost, work)


def fold_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The conversation with its leading system (or developer) messages folded into the
    first user message, as templates without a system role expect; None when there is
    nothing to fold or no user message right after them to fold into."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    if lead == 0 or lead == len(messages) or messages[lead].get("role") != "user":
        return None
    parts = [messages[i].get("content") for i in range(lead + 1)]
    if not all(isinstance(part, str) for part in parts):
        return None  # content parts: no plain text to join
    user = {**messages[lead], "content": "\n\n".join(p for p in parts if p)}
    return [user, *messages[lead + 1 :]]


class PromptTokenizer:
    """Encodes prompts for the gateway following the module's three rules.

    One pool and one set of tenant gates for the whole gateway, whatever model a prompt
    is for: `for_engine` gives the view that encodes with one engine's tokenizer. The
    methods below use the `engine` given here (a gateway of one model, tests).
    """

    def __init__(self, engine: EngineClient | None = None) -> None:
        self._default = None if engine is None else ModelPrompts(self, engine)
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="cloister-tok")
        self._gates: dict[str, _TenantGate] = {}

    def for_engine(self, engine: EngineClient) -> ModelPrompts:
        """Prompts encoded with `engine`'s tokenizer and checked against its context."""
        return ModelPrompts(self, engine)

    def _view(self) -> ModelPrompts:
        if self._default is None:
            raise RuntimeError("this PromptTokenizer has no default engine; use for_engine")
        return self._default

    @property
    def tokenizer(self) -> TokenizerLike:
        """The default engine's tokenizer."""
        return self._view().tokenizer

    def check_size(self, chars: int, *, param: str) -> None:
        """`check_prompt_size` against the default engine's context."""
        self._view().check_size(chars, param=param)

    async def encode(
        self, tenant_id: str, text: str, *, add_special_tokens: bool = True, param: str = "prompt"
    ) -> list[int]:
        """`ModelPrompts.encode` with the default engine."""
        return await self._view().encode(
            tenant_id, text, add_special_tokens=add_special_tokens, param=param
        )

    async def encode_chat(
        self,
        tenant_id: str,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """`ModelPrompts.encode_chat` with the default engine."""
        return await self._view().encode_chat(tenant_id, messages, tools=tools)

    async def run(self, tenant_id: str, cost: int, work: Callable[[], T]) -> T:
        """`work()` inline when cheap, else on the pool within the tenant's share of it."""
        if cost <= INLINE_CHARS:
            return work()
        gate = self._gates.get(tenant_id)
        if gate is None:
            gate = self._gates[tenant_id] = _TenantGate(asyncio.Semaphore(PER_TENANT_RUNNING))
        if gate.users >= PER_TENANT_RUNNING + PER_TENANT_WAITING:
            raise RateLimitedError(
                "concurrency",
                1.0,
                message="too many large prompts of this tenant are being tokenized; retry later",
            )
        gate.users += 1
        try:
            await gate.slots.acquire()
        except BaseException:
            self._leave(tenant_id, gate, holding=False)
            raise
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, work)
        except BaseException:
            self._leave(tenant_id, gate, holding=True)
            raise
        # The slot is held until the work itself ends, not until this caller stops
        # waiting: a client that hangs up cannot free its slot while a worker still
        # runs its prompt, so disconnecting and retrying never takes a second worker.
        future.add_done_callback(lambda f: self._leave(tenant_id, gate, holding=True, done=f))
        return await asyncio.shield(future)

    def _leave(
        self,
        tenant_id: str,
        gate: _TenantGate,
        *,
        holding: bool,
        done: asyncio.Future[Any] | None = None,
    ) -> None:
        if done is not None and not done.cancelled():
            done.exception()  # retrieved here: a caller that left never will
        if holding:
            gate.slots.release()
        gate.users -= 1
        if gate.users == 0 and self._gates.get(tenant_id) is gate:
            del self._gates[tenant_id]

    def close(self) -> None:
        """Stops the pool (app shutdown); queued work is dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)
