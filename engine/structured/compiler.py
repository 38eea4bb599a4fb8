"""Compiles `StructuredSpec`s into llguidance matchers, off the step loop, into a bounded cache.

    spec --digest--> cache hit? -- yes --> CompiledGrammar (prototype or error)
                        | no
                        v
            worker thread: to_grammar -> LLMatcher(tokenizer, grammar, limits)
                        |   (llguidance drops the GIL while it compiles)
                        v
            cache (LRU, `grammar_cache_size` entries) <-- also failures and timeouts

Entries are keyed by (cache domain, spec), like KV blocks: whether a spec compiles
at once must not tell one tenant that another sent the same schema recently (the
isolation invariant covers every cache whose hits show in latency).

A compiled grammar is a prototype matcher that never consumes a token; each
sequence gets its own `deep_copy` (about a microsecond). Failures are cached like
successes, so a bad or slow spec sent again is refused without a second compile.
The cache is bounded (CVE-2025-29770 was vLLM's unbounded one) and so is the
number of compiles queued at once.

A compile that takes longer than `grammar_compile_timeout_s` is refused: waiters
stop waiting at the limit, and the worker, once done, records the spec as too slow.
llguidance's own `LLParserLimits` bound the work a compile and each mask may do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf

from engine.config import StructuredConfig
from engine.errors import EngineOverloadedError
from engine.structured.grammar import to_grammar
from engine.structured.spec import StructuredSpec, StructuredSpecError


@dataclass(frozen=True)
class CompiledGrammar:
    """The outcome of one compile: a prototype matcher, or the reason it was refused."""

    digest: str
    prototype: llguidance.LLMatcher | None
    error: str | None
    compile_s: float

    def raise_if_error(self) -> None:
        """Raises the compile's error as a 400."""
        if self.error is not None:
            raise StructuredSpecError(self.error, param="response_format")


def spec_digest(spec: StructuredSpec, domain: str = "") -> str:
    """A cache key for `spec` in cache domain `domain`: the fields length-prefixed, so no
    two different (domain, kind, value) share a key."""
    payload = b""
    for part in (domain, spec.kind, spec.value):
        data = part.encode("utf-8", "surrogatepass")
        payload += len(data).to_bytes(8, "little") + data
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


class GrammarCompiler:
    """Compiles specs against one tokenizer; thread-safe; one per engine (or front).

    `tokenizer` is a transformers fast tokenizer, or an engine `Tokenizer` (its `.hf`
    is used); its llguidance view is built once, on the first compile (about 0.25 s,
    on a worker thread), so an engine that never sees a constraint never builds it.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        config: StructuredConfig | None = None,
        limits: llguidance.LLParserLimits | None = None,
    ) -> None:
        self.config = config or StructuredConfig()
        self._source = tokenizer
        self._vocab_size = vocab_size
        self._eos = sorted(int(t) for t in eos_token_ids)
        # Errors name the schema keyword; the parser's state would only leak the grammar.
        self._limits = limits or llguidance.LLParserLimits(verbose_errors=False)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()  # held for the one slow build only
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._pending: dict[str, concurrent.futures.Future[CompiledGrammar]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.grammar_compile_threads, thread_name_prefix="grammar"
        )
        self.num_compiles = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (built on first use)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                eos: int | list[int] | None = self._eos or None
                hf = getattr(self._source, "hf", self._source)
                self._tokenizer = llguidance.hf.from_tokenizer(
                    hf, n_vocab=self._vocab_size, eos_token=eos
                )
            return self._tokenizer

    @property
    def vocab_size(self) -> int:
        """Width of the token masks (the model's logits)."""
        return self._vocab_size

    # -- looking up and compiling -----------------------------------------------------

    def lookup(self, spec: StructuredSpec, domain: str = "") -> CompiledGrammar | None:
        """The cached outcome for `spec`, if any (marks it recently used); never compiles."""
        digest = spec_digest(spec, domain)
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
            return entry

    def submit(
        self, spec: StructuredSpec, domain: str = ""
    ) -> concurrent.futures.Future[CompiledGrammar]:
        """A future of `spec`'s outcome: done at once on a hit, else compiled on a worker.

        Compiles of the same spec are shared. Raises `EngineOverloadedError` when
        `grammar_max_pending` compiles are already queued or running.
        """
        digest = spec_digest(spec, domain)
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None:
                self._cache.move_to_end(digest)
                done: concurrent.futures.Future[CompiledGrammar] = concurrent.futures.Future()
                done.set_result(entry)
                return done
            pending = self._pending.get(digest)
            if pending is not None:
                return pending
            if len(self._pending) >= self.config.grammar_max_pending:
                raise EngineOverloadedError(
                    f"{len(self._pending)} grammars are being compiled; retry later"
                )
            future = self._pool.submit(self._compile, spec, digest)
            self._pending[digest] = future
            return future

    def compile(self, spec: StructuredSpec, domain: str = "") -> CompiledGrammar:
        """Blocks until `spec` is compiled (at most the timeout); raises a 400 on failure."""
        future = self.submit(spec, domain)
        try:
            entry = future.result(timeout=self.config.grammar_compile_timeout_s)
        except concurrent.futures.TimeoutError:
            raise self._too_slow() from None
        entry.raise_if_error()
        return entry

    async def prepare(self, spec: StructuredSpec, domain: str = "") -> CompiledGrammar:
        """`compile` for an event loop: the loop never blocks, whatever the spec costs."""
        wrapped = asyncio.wrap_future(self.submit(spec, domain))
        # `wait`, not `wait_for`: a timeout must not cancel a compile others may share.
        done, _ = await asyncio.wait({wrapped}, timeout=self.config.grammar_compile_timeout_s)
        if not done:
            raise self._too_slow()
        entry = wrapped.result()
        entry.raise_if_error()
        return entry

    def matcher(self, spec: StructuredSpec, domain: str = "") -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (compiles first on a miss)."""
        entry = self.lookup(spec, domain) or self.compile(spec, domain)
        entry.raise_if_error()
        assert entry.prototype is not None
        return entry.prototype.deep_copy()

    def refuse(self, spec: StructuredSpec, domain: str, reason: str) -> None:
        """Replaces `spec`'s cached grammar with a refusal (one that proved too costly to
        run): later requests of `domain` under it are 400s when compiled."""
        digest = spec_digest(spec, domain)
        with self._lock:
            entry = self._cache.get(digest)
            if entry is not None and entry.error is None:
                self._cache[digest] = CompiledGrammar(digest, None, reason, entry.compile_s)

    def shutdown(self) -> None:
        """Stops the workers once their compiles are done (pending ones are dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- invariants ---------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)

    def check_integrity(self) -> None:
        """The cache holds at most its bound; each entry is either a grammar or an error."""
        with self._lock:
            assert len(self._cache) <= self.config.grammar_cache_size, len(self._cache)
            for digest, entry in self._cache.items():
                assert entry.digest == digest
                assert (entry.prototype is None) != (entry.error is None)
            assert len(self._pending) <= self.config.grammar_max_pending

    # -- on a worker ----------------------------------------------------------------

    def _compile(self, spec: StructuredSpec, digest: str) -> CompiledGrammar:
        start = time.perf_counter()
        try:
            entry = self._build(spec, digest, start)
        except BaseException:
            with self._lock:
                self._pending.pop(digest, None)
            raise
        with self._lock:
            self._pending.pop(digest, None)
            self._cache[digest] = entry
            self._cache.move_to_end(digest)
            while len(self._cache) > self.config.grammar_cache_size:
                self._cache.popitem(last=False)
            self.num_compiles += 1
        return entry

    def _build(self, spec: StructuredSpec, digest: str, start: float) -> CompiledGrammar:
        tokenizer = self.tokenizer
        try:
            grammar = to_grammar(spec)
        except StructuredSpecError as exc:
            return CompiledGrammar(digest, None, exc.message, time.perf_counter() - start)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=self._limits)
        error = matcher.get_error() if matcher.is_error() else _first_mask_error(matcher)
        elapsed = time.perf_counter() - start
        if error is not None:
            return CompiledGrammar(digest, None, error, elapsed)
        if elapsed > self.config.grammar_compile_timeout_s:
            return CompiledGrammar(digest, None, self._too_slow().message, elapsed)
        return CompiledGrammar(digest, matcher, None, elapsed)

    def _too_slow(self) -> StructuredSpecError:
        limit = self.config.grammar_compile_timeout_s
        return StructuredSpecError(
            f"the constraint took longer than the {limit:g} s limit to compile; "
            "simplify the schema or grammar",
            param="response_format",
        )


def _first_mask_error(prototype: llguidance.LLMatcher) -> str | None:
    """Why no output can begin under `prototype` (its first mask, computed on a copy),
    or None. Every request under the grammar would compute the same mask first: a
    constraint no text matches (an empty regex, `A: "a" & "b"`) is refused here, once,
    instead of failing each request in the engine."""
    probe = prototype.deep_copy()
    mask = probe.compute_bitmask()
    if probe.is_error():
        error = probe.get_error()
        if "NoExtensionBias" not in error:
            return _refusal(error)
    elif any(mask):
        return None
    return "the constraint cannot be satisfied: no text the model can write matches it"


def _refusal(error: str) -> str:
    """llguidance's message (it names the unsupported keyword), prefixed, one paragraph."""
    text = error.strip() or "the grammar is invalid"
    return f"the constraint cannot be enforced: {text}"
