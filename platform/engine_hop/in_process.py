"""`InProcessEngineClient`: the `EngineClient` of an engine front on this machine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING

from engine.kv_cache.cache_rules import CacheRules
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.structured.spec import StructuredSpec
from engine_hop.adapters import AdapterInfo
from engine_hop.client import EngineSnapshot, TokenizerLike
from engine_hop.replicas import IN_PROCESS, ReplicaState

if TYPE_CHECKING:
    from engine.fronts.async_engine import AsyncEngine
    from engine.fronts.process_engine import ProcessEngine


class InProcessEngineClient:
    """An `EngineClient` over an engine front on this machine: an `AsyncEngine` (engine
    loop on a thread of this process) or a `ProcessEngine` (loop in a child process)."""

    def __init__(
        self, engine: AsyncEngine | ProcessEngine, *, model_name: str | None = None
    ) -> None:
        # `engine` is an engine front (engine.fronts: an AsyncEngine or a ProcessEngine);
        # tests hand in stand-ins with its surface.
        self._engine = engine
        self.model_name: str = model_name or engine.model_name
        self.max_model_len: int = int(engine.max_model_len)
        self.vocab_size: int = int(engine.vocab_size)

    @property
    def tokenizer(self) -> TokenizerLike:
        """The engine's tokenizer."""
        tokenizer: TokenizerLike = self._engine.tokenizer
        return tokenizer

    def submit(self, request: EngineRequest) -> AsyncIterator[StreamEvent]:
        """Forwards to the front's `submit`; its stream is already an async iterator."""
        stream: AsyncIterator[StreamEvent] = self._engine.submit(request)
        return stream

    async def abort(self, request_id: str) -> None:
        """Forwards to `AsyncEngine.abort`."""
        await self._engine.abort(request_id)

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Forwards to `EngineFront.prepare_structured`."""
        await self._engine.prepare_structured(spec, cache_domain)

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Forwards to `EngineFront.update_cache_rules`."""
        await self._engine.update_cache_rules(rules)

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Forwards to `EngineFront.load_adapter`."""
        return await self._engine.load_adapter(name, path)

    async def unload_adapter(self, name: str) -> None:
        """Forwards to `EngineFront.unload_adapter` (AdapterInUseError while in use)."""
        await self._engine.unload_adapter(name)

    def adapters(self) -> list[AdapterInfo]:
        """The front's loaded adapters (`EngineFront.adapters`)."""
        return self._engine.adapters()

    def stats(self) -> EngineSnapshot:
        """Copies the fields the gateway exports out of `AsyncEngine.stats()`."""
        s = self._engine.stats()
        return EngineSnapshot(
            num_running=int(s.num_running),
            num_waiting=int(s.num_waiting),
            kv_cache_usage=float(s.kv_cache_usage),
            prefix_cache_queries=int(s.prefix_cache_queries),
            prefix_cache_hits=int(s.prefix_cache_hits),
            num_preemptions=int(s.num_preemptions),
            num_prompt_tokens=int(s.num_prompt_tokens),
            num_generation_tokens=int(s.num_generated_tokens),
            num_blocks=int(s.num_blocks),
            block_size=int(s.block_size),
            max_loras=int(s.max_loras),
            # The engine counts sequences per adapter name (engine.stats.EngineStats).
            running_adapters=_names(s.lora_running),
            waiting_adapters=_names(s.lora_waiting),
            prefill_token_cap=s.prefill_token_cap,
            kv_events_dropped=s.kv_events_dropped,
            tenant_kv=dict(s.tenant_kv or {}),
            num_batch_running=int(s.num_batch_running),
            num_batch_waiting=int(s.num_batch_waiting),
            kv_tiers=tuple(s.kv_tiers),
            spec_decode=s.spec_decode,
            num_overlapped_steps=int(s.num_overlapped_steps),
            num_synchronous_steps=int(s.num_synchronous_steps),
        )

    def public_prefix_blocks(self) -> int:
        """Blocks of published prefixes (the public cache domain, "<public>") in the
        engine's KV cache now; 0 for an engine that does not report cache domains."""
        domains = self._engine.stats().prefix_cache_domains or {}
        public = domains.get("<public>")
        return 0 if public is None else int(public.cached_blocks)

    def replica_states(self) -> list[ReplicaState]:
        """The one engine in this process, with its published-prefix blocks."""
        return [
            ReplicaState(
                replica=IN_PROCESS,
                alive=self.alive,
                snapshot=self.stats(),
                in_process=True,
                public_cached_blocks=self.public_prefix_blocks(),
            )
        ]

    @property
    def alive(self) -> bool:
        """Whether the engine takes requests."""
        return bool(self._engine.alive)

    async def start(self) -> None:
        """Starts the engine loop."""
        await self._engine.start()

    async def shutdown(self) -> None:
        """Stops the engine loop."""
        await self._engine.shutdown()


def _names(value: Mapping[str, int] | Iterable[str] | None) -> tuple[str, ...] | None:
    """Adapter names from an engine stat (name -> sequences, or names; None: not
    reported); names with no sequence are left out."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return tuple(str(name) for name, count in value.items() if count)
    return tuple(str(v) for v in value)
