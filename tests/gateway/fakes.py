"""A small fake of the AsyncEngine surface the gateway uses (byte tokenizer, scripted text)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ContextLengthExceededError, EngineOverloadedError, InvalidRequestError
from engine.kv_cache.cache_rules import CacheRules
from engine.outputs import (
    CompletionDelta,
    PositionLogprobs,
    RequestMetrics,
    StreamEvent,
    TokenLogprob,
)
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats
from engine.structured.spec import StructuredSpec, StructuredSpecError
from engine_hop.adapters import AdapterInfo, AdapterInUseError

EOS = 256
BLOCK = 16
REPLY = "the quick brown fox jumps over the lazy dog. " * 40


class ByteTokenizer:
    """UTF-8 bytes as token ids; 256 is EOS."""

    eos_token_ids = (EOS,)
    vocab_size = 260

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Bytes of `text`."""
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids (others dropped)."""
        return bytes(i for i in ids if i < 256).decode(errors="replace")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """A fixed, simple template (it ignores tools, as SmolLM2's does)."""
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass(frozen=True)
class FakeStats(EngineStats):
    """engine.stats.EngineStats over the fake's pool; it reports no adapters' sequences."""

    num_blocks: int = 64
    block_size: int = BLOCK
    lora_running: dict[str, int] | None = None  # type: ignore[assignment]
    lora_waiting: dict[str, int] | None = None  # type: ignore[assignment]


class AdapterNotFoundError(InvalidRequestError):
    """The engine front's error for a request naming an adapter it has not loaded."""

    code = "adapter_not_found"


class FakeEngine:
    """Streams scripted text token by token; tracks aborts and a per-domain prefix cache."""

    def __init__(
        self,
        *,
        max_model_len: int = 512,
        token_delay_s: float = 0.002,
        max_waiting: int = 64,
        reply: str | None = None,
    ) -> None:
        self.tokenizer = ByteTokenizer()
        # With `reply`, a greedy request gets exactly that text, then stops.
        self.reply = reply
        self.max_model_len = max_model_len
        self.vocab_size = ByteTokenizer.vocab_size
        self.model_name = "fake-model"
        self.token_delay_s = token_delay_s
        self.max_waiting = max_waiting
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.domains: list[str] = []
        self._seen: dict[str, list[tuple[int, ...]]] = {}
        self._queries = 0
        self._hits = 0
        self.cache_rules: CacheRules | None = None  # the last rules pushed
        # A fake adapter registry: name -> what load_adapter read from the PEFT folder.
        self.loaded_adapters: dict[str, AdapterInfo] = {}
        self.adapter_of: dict[str, str | None] = {}  # request id -> the adapter it named
        self.pinned_adapters: set[str] = set()  # adapters a test holds "in use"

    alive = True  # a fake never dies

    async def start(self) -> None:
        """Nothing to start."""

    async def shutdown(self) -> None:
        """Nothing to stop."""

    def submit(self, request: EngineRequest) -> AsyncIterator[StreamEvent]:
        """Validates like the engine, then returns the stream."""
        params = request.params
        prompt = request.prompt_token_ids
        if len(prompt) + (params.max_tokens or 1) > self.max_model_len:
            raise ContextLengthExceededError("too long", param="prompt")
        if len(self.running) >= self.max_waiting:
            raise EngineOverloadedError("full", retry_after_s=2.0)
        if request.adapter is not None and request.adapter not in self.loaded_adapters:
            raise AdapterNotFoundError(f"adapter {request.adapter!r} is not loaded", param="model")
        self.running.add(request.request_id)
        self.adapter_of[request.request_id] = request.adapter
        self.domains.append(request.cache_domain)
        cached = self._lookup(request.cache_domain, prompt)
        return self._run(request.request_id, list(prompt), params, cached)

    def _lookup(self, domain: str, prompt: tuple[int, ...]) -> int:
        best = 0
        for seen in self._seen.get(domain, []):
            common = 0
            for a, b in zip(seen, prompt, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        self._seen.setdefault(domain, []).append(prompt)
        cached = min(best, len(prompt) - 1) // BLOCK * BLOCK
        self._queries += len(prompt)
        self._hits += cached
        return cached

    async def _run(
        self, rid: str, prompt: list[int], params: SamplingParams, cached: int
    ) -> AsyncIterator[StreamEvent]:
        arrival = time.time()
        texts = [""] * params.n
        done = [False] * params.n
        rngs = [
            random.Random(None if params.seed is None else params.seed + i) for i in range(params.n)
        ]
        try:
            for step in range(params.max_tokens or self.max_model_len):
                await asyncio.sleep(self.token_delay_s)
                if rid not in self.running:
                    deltas = tuple(
                        CompletionDelta(i, "", (), None, "abort")
                        for i in range(params.n)
                        if not done[i]
                    )
                    yield StreamEvent(rid, deltas, tuple(prompt), cached, True)
                    return
                deltas = []
                for i in range(params.n):
                    if done[i]:
                        continue
                    ch = REPLY[step % len(REPLY)] if params.greedy else rngs[i].choice("abcdefgh ")
                    reply = self.reply if params.greedy else None
                    if reply is not None:
                        ch = reply[step] if step < len(reply) else ""
                    texts[i] += ch
                    finish = None
                    hit = next((s for s in params.stop if s in texts[i]), None)
                    if reply is not None and step + 1 >= len(reply):
                        finish = "stop"
                    elif hit is not None:
                        ch = ch[: len(ch) - (len(texts[i]) - texts[i].index(hit))]
                        finish = "stop"
                    elif step + 1 == params.max_tokens:
                        finish = "length"
                    lp = None
                    if params.logprobs is not None:
                        tok = TokenLogprob(ord(ch[0]) if ch else 32, -0.5, ch)
                        lp = (PositionLogprobs(tok, tuple(tok for _ in range(params.logprobs))),)
                    deltas.append(CompletionDelta(i, ch, (ord(ch[0]) if ch else 32,), lp, finish))
                    done[i] = finish is not None
                finished = all(done)
                metrics = RequestMetrics(
                    arrival, arrival, time.time(), time.time() if finished else None
                )
                yield StreamEvent(rid, tuple(deltas), tuple(prompt), cached, finished, metrics)
                if finished:
                    return
        finally:
            self.running.discard(rid)

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Records the rules (a fake has no cache to apply them to)."""
        self.cache_rules = rules

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Reads the PEFT folder's config and digests its weights, as the engine would."""
        folder = Path(path)
        config = json.loads((folder / "adapter_config.json").read_text())
        weights = (folder / "adapter_model.safetensors").read_bytes()
        info = AdapterInfo(
            name=name,
            rank=int(config["r"]),
            alpha=float(config.get("lora_alpha", config["r"])),
            digest=hashlib.sha256(weights).hexdigest(),
            target_modules=tuple(config.get("target_modules") or ()),
            location="device",  # a fake has one memory: every adapter is "on the device"
        )
        self.loaded_adapters[name] = info
        return info

    async def unload_adapter(self, name: str) -> None:
        """Forgets the adapter; refuses while a running request or a test pins it."""
        running = {self.adapter_of.get(r) for r in self.running}
        if name in self.pinned_adapters or name in running:
            raise AdapterInUseError(f"adapter {name!r} is in use")
        self.loaded_adapters.pop(name, None)

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters."""
        return list(self.loaded_adapters.values())

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Refuses every constraint (a 400): the fake's scripted text obeys none."""
        raise StructuredSpecError(
            f"the fake engine cannot constrain output ({spec.kind})", param="response_format"
        )

    async def abort(self, request_id: str) -> None:
        """Marks the request aborted; its stream ends at the next step."""
        if request_id in self.running:
            self.aborted.append(request_id)
            self.running.discard(request_id)

    def stats(self) -> FakeStats:
        """Current counters."""
        return FakeStats(len(self.running), 0, len(self.running) / 64, self._queries, self._hits, 0)
