"""`ReplicaSetClient`: one `EngineClient` over several engine servers of one model.

Replicas come from a static list of URLs, or from `dns+http://name:port`, whose
addresses (a Kubernetes headless Service's pods) are re-resolved every `refresh_s`.
Each request is routed by engine_hop.routing's policy (`prefix_affine` by default,
`session` or `round_robin`); if its replica refuses it as overloaded or fails before
the first event (unreachable, died), it is sent to the next one in the route order,
and never after a token was streamed. The stream's `admitted` tries the route until a
replica admits the request, and raises the last refusal when none does. A replica
whose stats polls fail leaves the set (within about three poll periods) and rejoins,
ramping up, when it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

from engine.errors import EngineDeadError, EngineOverloadedError
from engine.kv_cache.cache_rules import CacheRules
from engine.outputs import StreamEvent
from engine.request import EngineRequest
from engine.structured.spec import StructuredSpec
from engine_hop.adapters import AdapterInfo
from engine_hop.client import (
    EngineSnapshot,
    TokenizerLike,
    sum_kv_tiers,
    sum_spec_decode,
    sum_tenant_kv,
)
from engine_hop.link_client import READ_TIMEOUT_S, LinkStream
from engine_hop.remote_client import (
    EngineServerInfo,
    RemoteEngineClient,
    RemoteStream,
    Transport,
    first_info,
    local_grammar_checker,
)
from engine_hop.remote_errors import EngineUnavailableError
from engine_hop.replicas import ReplicaState
from engine_hop.routing import ReplicaLoad, RouteRequest, RoutingConfig, make_policy

logger = logging.getLogger("cloister.gateway.replicas")
DNS_SCHEME = "dns+"


def expand_urls(urls: Sequence[str]) -> list[str]:
    """Static URLs as they are; each `dns+http://name:port` as one URL per address now."""
    out: list[str] = []
    for url in urls:
        if not url.startswith(DNS_SCHEME):
            out.append(url.rstrip("/"))
            continue
        parts = urllib.parse.urlsplit(url.removeprefix(DNS_SCHEME))
        host, port = parts.hostname or "", parts.port or 80
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            continue  # the name does not resolve (yet): no replicas from it this round
        for address in sorted({str(info[4][0]) for info in infos}):
            shown = f"[{address}]" if ":" in address else address
            out.append(f"{parts.scheme}://{shown}:{port}")
    return list(dict.fromkeys(out))


# When the replicas the set starts with "joined": long ago, so they start warm. They are
# alike, so a ramp among them ranks nothing differently, except that their join times
# differ by the milliseconds it takes to make each client: their weights' ratio then
# drifts toward 1 over the ramp, and the keys near a tie move from one replica to another
# mid-conversation (a later turn that misses its cache).
FOUNDING = float("-inf")


class _Replica:
    """One engine server and when it last joined the set."""

    def __init__(self, client: RemoteEngineClient, joined_at: float) -> None:
        self.client = client
        self.joined_at = joined_at
        self.was_alive = True

    def load(self, in_flight: int) -> ReplicaLoad:
        # The polled depth is up to a poll old; this gateway's own in-flight requests
        # are current, so a burst sees the queue it is building (the bounded-load escape).
        s = self.client.stats()
        depth = max(s.num_waiting + s.num_running, in_flight)
        return ReplicaLoad(self.client.base_url, depth, s.kv_cache_usage, self.joined_at)


class ReplicaSetClient:
    """An `EngineClient` that routes each request to one of several engine servers."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None,
        tokenizer: TokenizerLike,
        model_name: str,
        resolve: Callable[[Sequence[str]], list[str]] = expand_urls,
        routing: RoutingConfig | None = None,
        policy: str = "prefix_affine",
        refresh_s: float = 2.0,
        poll_s: float = 1.0,
        connect_wait_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        transport: Transport = "link",
        request_timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        """`clock`: monotonic seconds, for the ramp (a test's own clock); `transport`:
        how completions reach each replica (engine_hop.remote_client); `request_timeout_s`:
        the longest wait for a request's next event from its replica."""
        self._clock = clock
        self._transport = transport
        self._request_timeout_s = request_timeout_s
        self._urls, self._token, self._tokenizer = tuple(urls), token, tokenizer
        self._resolve, self._refresh_s, self._poll_s = resolve, refresh_s, poll_s
        self.model_name = model_name
        # Any replica that answers will do: the others join as the polls find them.
        found: list[str] = []

        def candidates() -> list[str]:
            found[:] = resolve(self._urls)  # the round that answers is the set's start
            return found

        url, info = first_info(
            candidates, token, wait_s=connect_wait_s, described=", ".join(self._urls)
        )
        if info.model_name != model_name:
            raise EngineUnavailableError(
                f"the engine at {url} serves {info.model_name!r}, not {model_name!r}"
            )
        self.info = info
        self.max_model_len: int = info.max_model_len
        self.vocab_size: int = info.vocab_size
        self.routing = routing or RoutingConfig(block_size=info.block_size)
        self.policy = make_policy(policy, self.routing)
        self._replicas: dict[str, _Replica] = {
            u: self._new(u, info, joined_at=FOUNDING) for u in found
        }
        self._owners: dict[str, RemoteEngineClient] = {}  # request id -> its replica
        self._refresher: asyncio.Task[None] | None = None
        self._closed = False
        self._grammars = local_grammar_checker(tokenizer, info.vocab_size)

    def _new(self, url: str, info: EngineServerInfo, joined_at: float | None = None) -> _Replica:
        client = RemoteEngineClient(
            url,
            token=self._token,
            tokenizer=self._tokenizer,
            info=info,
            poll_s=self._poll_s,
            transport=self._transport,
            request_timeout_s=self._request_timeout_s,
        )
        client.model_name = self.model_name
        return _Replica(client, self._clock() if joined_at is None else joined_at)

    @property
    def tokenizer(self) -> TokenizerLike:
        """The model's tokenizer."""
        return self._tokenizer

    def replicas(self) -> list[RemoteEngineClient]:
        """The replicas in the set now, alive or not."""
        return [r.client for r in self._replicas.values()]

    def in_flight(self) -> Counter[str]:
        """This gateway's requests streaming from each replica now, by URL."""
        return Counter(c.base_url for c in self._owners.values())

    def replica_states(self) -> list[ReplicaState]:
        """Each replica in the set, in order, with this gateway's requests on it."""
        in_flight = self.in_flight()
        return [r.replica_state(in_flight[r.base_url]) for r in self.replicas()]

    def _healthy(self) -> list[_Replica]:
        now = self._clock()
        healthy = []
        for replica in self._replicas.values():
            alive = replica.client.alive
            if alive and not replica.was_alive:
                replica.joined_at = now  # back from a failure: ramp up from a cold cache
                logger.info("engine replica %s rejoined", replica.client.base_url)
            elif not alive and replica.was_alive:
                logger.warning("engine replica %s left the set", replica.client.base_url)
            replica.was_alive = alive
            if alive:
                healthy.append(replica)
        return healthy

    def route(self, request: EngineRequest) -> list[RemoteEngineClient]:
        """The replicas to try for `request`, in order."""
        healthy = self._healthy()
        if not healthy:
            raise EngineUnavailableError("no engine replica is serving")
        if request.adapter is not None:
            # A replica that just (re)started lacks the adapter until the sync's next pass.
            holding = [r for r in healthy if r.client.has_adapter(request.adapter)]
            healthy = holding or healthy
        what = RouteRequest(
            request.cache_domain, request.adapter, request.prompt_token_ids, request.session
        )
        in_flight = self.in_flight()
        loads = [r.load(in_flight[r.client.base_url]) for r in healthy]
        order = self.policy.order(what, loads, self._clock())
        return [self._replicas[url].client for url in order]

    def submit(self, request: EngineRequest) -> _RoutedStream:
        """Routes and sends; falls back to the next replica until the first event."""
        if self._closed:
            raise EngineDeadError("the engine client was shut down")
        return _RoutedStream(self, request, self.route(request))

    def own(self, request_id: str, client: RemoteEngineClient | None) -> None:
        """Records (or forgets, with None) which replica runs a request."""
        if client is None:
            self._owners.pop(request_id, None)
        else:
            self._owners[request_id] = client

    async def prepare_structured(self, spec: StructuredSpec, cache_domain: str) -> None:
        """Checks `spec` compiles (a `StructuredSpecError`, a 400, if not), on a worker."""
        await self._grammars.prepare(spec, cache_domain)

    async def abort(self, request_id: str) -> None:
        """Aborts the request on the replica that runs it."""
        client = self._owners.pop(request_id, None)
        if client is not None:
            await client.abort(request_id)

    async def update_cache_rules(self, rules: CacheRules) -> None:
        """Pushes the rules to every replica; raises only when none took them."""
        clients = self.replicas()
        results = await asyncio.gather(
            *(c.update_cache_rules(rules) for c in clients), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed and len(failed) == len(clients):
            raise EngineUnavailableError(f"no engine replica took the cache rules: {failed[0]}")

    def _live(self) -> list[RemoteEngineClient]:
        return [r.client for r in self._replicas.values() if r.client.alive]

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Loads the adapter on each live replica that lacks it (on every live one when
        all have it: a reload). A replica that joins or restarts later lacks it, so the
        registry sync's next pass loads it there (see `adapters`)."""
        live = self._live()
        if not live:
            raise EngineUnavailableError("no engine replica to load the adapter on")
        targets = [c for c in live if name not in {a.name for a in c.adapters()}] or live
        results = await asyncio.gather(
            *(c.load_adapter(name, path) for c in targets), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result  # those that took it keep it; the next pass retries the rest
        infos = [r for r in results if isinstance(r, AdapterInfo)]
        return infos[0]

    async def unload_adapter(self, name: str) -> None:
        """Unloads the adapter from each live replica that has it; raises the first
        refusal (`AdapterInUseError` while one still runs its requests)."""
        holders = [c for c in self._live() if name in {a.name for a in c.adapters()}]
        results = await asyncio.gather(
            *(c.unload_adapter(name) for c in holders), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def adapters(self) -> list[AdapterInfo]:
        """The adapters every live replica has loaded: one that some replica lacks is not
        listed, so the registry sync loads it again (on those that lack it)."""
        listings = [{a.name: a for a in c.adapters()} for c in self._live()]
        if not listings:
            return []
        common = set(listings[0]).intersection(*listings[1:])
        return [listings[0][n] for n in sorted(common)]

    def partly_loaded_adapters(self) -> list[str]:
        """Adapters some live replicas have and others lack (the sync unloads a retired
        one wherever it is left)."""
        listings = [{a.name for a in c.adapters()} for c in self._live()]
        if not listings:
            return []
        return sorted(set().union(*listings) - set(listings[0]).intersection(*listings[1:]))

    def stats(self) -> EngineSnapshot:
        """The replicas' figures summed (KV usage: their mean)."""
        live = [r.client for r in self._replicas.values() if r.client.alive]
        snaps = [c.stats() for c in live]
        if not snaps:
            return EngineSnapshot(0, 0, 0.0, 0, 0, 0)
        return EngineSnapshot(
            num_running=sum(s.num_running for s in snaps),
            num_waiting=sum(s.num_waiting for s in snaps),
            kv_cache_usage=sum(s.kv_cache_usage for s in snaps) / len(snaps),
            prefix_cache_queries=sum(s.prefix_cache_queries for s in snaps),
            prefix_cache_hits=sum(s.prefix_cache_hits for s in snaps),
            num_preemptions=sum(s.num_preemptions for s in snaps),
            tenant_kv=sum_tenant_kv(s.tenant_kv for s in snaps),
            num_batch_running=sum(s.num_batch_running for s in snaps),
            num_batch_waiting=sum(s.num_batch_waiting for s in snaps),
            spec_decode=sum_spec_decode(s.spec_decode for s in snaps),
            num_overlapped_steps=sum(s.num_overlapped_steps for s in snaps),
            num_synchronous_steps=sum(s.num_synchronous_steps for s in snaps),
            # The stats poll carries load only; the pool's shape came with /internal/info.
            block_size=max(c.info.block_size for c in live),
            kv_tiers=sum_kv_tiers(s.kv_tiers for s in snaps),
        )

    @property
    def alive(self) -> bool:
        """True while at least one replica serves."""
        return not self._closed and any(r.client.alive for r in self._replicas.values())

    async def start(self) -> None:
        """Starts every replica's poller and the re-resolution of the URLs."""
        for replica in self._replicas.values():
            await replica.client.start()
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    async def shutdown(self) -> None:
        """Stops routing and closes every replica's connections."""
        self._closed = True
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        for replica in self._replicas.values():
            await replica.client.shutdown()
        self._grammars.shutdown()

    async def refresh_once(self) -> None:
        """Re-resolves the URLs: new addresses join (ramping), vanished ones leave."""
        found = await asyncio.to_thread(self._resolve, self._urls)
        for url in found:
            if url not in self._replicas:
                replica = self._new(url, self.info)
                await replica.client.start()
                await replica.client.poll_once()
                self._replicas[url] = replica
                logger.info("engine replica %s joined", url)
        for url in [u for u in self._replicas if u not in found]:
            replica = self._replicas.pop(url)
            logger.info("engine replica %s is gone", url)
            await replica.client.shutdown()

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh_once()
            except Exception:  # a bad round must not stop the next one
                logger.exception("re-resolving the engine replicas failed")


class _RoutedStream:
    """A request's events from the first replica of its route that takes it."""

    def __init__(
        self, owner: ReplicaSetClient, request: EngineRequest, route: list[RemoteEngineClient]
    ) -> None:
        self._owner, self._request, self._route = owner, request, list(route)
        self._current = self._send()
        self._started = False
        self._done = False

    def _send(self) -> RemoteStream | LinkStream:
        client = self._route.pop(0)
        self._owner.own(self._request.request_id, client)
        return client.submit(self._request)

    async def admitted(self) -> None:
        """Returns once a replica of the route admitted the request; an overloaded or
        unreachable one passes it to the next, and the last one's refusal is raised."""
        while True:
            try:
                await self._current.admitted()
                return
            except (EngineUnavailableError, EngineOverloadedError, EngineDeadError):
                if self._started or not self._route:
                    self._finish()
                    raise
                await self._current.aclose()
                self._current = self._send()
            except BaseException:
                self._finish()
                raise

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._done:
            raise StopAsyncIteration
        while True:
            try:
                event = await self._current.__anext__()
            except (EngineUnavailableError, EngineOverloadedError, EngineDeadError):
                if self._started or not self._route:
                    self._finish()
                    raise
                await self._current.aclose()
                self._current = self._send()  # nothing was streamed yet: try the next one
                continue
            except BaseException:
                self._finish()
                raise
            self._started = True
            if event.finished:
                self._finish()
            return event

    def _finish(self) -> None:
        self._done = True
        self._owner.own(self._request.request_id, None)

    async def aclose(self) -> None:
        """Hangs up on the replica."""
        self._finish()
        await self._current.aclose()
