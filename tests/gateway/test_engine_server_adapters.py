"""LoRA adapters over the engine server's internal API, in one process (fast): two engine
server apps over the real engine (on the fake fast model), reached through `RemoteEngineClient` and
`ReplicaSetClient`.

Hostile input on the new routes is a 4xx with an OpenAI error body and leaves nothing
on disk; a pushed folder loads, lists, counts its requests on /metrics, refuses to
unload while in use and is removed with its files; a replica set loads on every
replica, and the registry sync re-loads on a replica that lost its adapters (restarted)
and unloads a retired one wherever it is left. Each replica reports its own device and
dtype. The real engine's refusals (bad shapes, rank over the maximum) are in
test_adapters_split_live.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from admin import registry
from admin.models import LoraAdapter
from assembly.adapter_sync import AdapterSync
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine_hop.adapters import AdapterInUseError
from engine_hop.remote_client import RemoteEngineClient, fetch_info
from engine_hop.replica_set import ReplicaSetClient
from engine_server.app import EngineServer
from engine_server.auth import ServiceAuth
from tenancy.db import make_engine, make_session_factory, upgrade_database
from tests.admin.zip_archives import adapter_files, raw_zip, stored, zip_of
from tests.gateway.test_trace_hop import serve_in_thread
from tests.utils.adapter_engine import ARCHIVE_SHAPE, AdapterTestEngine, adapter_test_engine
from tests.utils.byte_tokenizer import ByteTokenizer

TOKEN = "svc-" + "adapter-push-token-for-tests"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@dataclass
class Served:
    """One engine server app over the real engine (the fake fast model), on a loopback port."""

    url: str
    fake: AdapterTestEngine
    server: EngineServer


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Served]]:
    served, stops = [], []
    for i, dtype in enumerate(("float32", "bfloat16")):
        # It reports no adapter slots, so the lora series are the server's own counts.
        fake = adapter_test_engine(ARCHIVE_SHAPE, report_lora=False)
        server = EngineServer(
            fake,
            model_name="tiny",
            auth=ServiceAuth(TOKEN),
            device="cpu",
            dtype=dtype,
            adapter_dir=tmp_path_factory.mktemp(f"engine-{i}"),
        )
        url, stop = serve_in_thread(server.app())
        served.append(Served(url, fake, server))
        stops.append(stop)
    try:
        yield served
    finally:
        for stop in stops:
            stop()


def _folder(path: Path, files: dict[str, bytes] | None = None) -> str:
    path.mkdir(parents=True, exist_ok=True)
    for name, data in (files or adapter_files()).items():
        (path / name).write_bytes(data)
    return str(path)


def _put(url: str, name: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.put(f"{url}/internal/adapters/{name}", content=body, headers=headers)


def _assert_openai_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def test_the_adapter_routes_need_the_service_credential(servers: list[Served]) -> None:
    url = servers[0].url
    body = zip_of(adapter_files())
    tenant_key = {"authorization": "Bearer sk-cloister-a-tenant-api-key-0123456789"}
    for headers in ({}, tenant_key, {"authorization": TOKEN}):  # the last: no "Bearer "
        _assert_openai_error(_put(url, "a", body, **headers), 401)
        _assert_openai_error(httpx.delete(f"{url}/internal/adapters/a", headers=headers), 401)
        _assert_openai_error(httpx.get(f"{url}/internal/adapters", headers=headers), 401)
    assert servers[0].fake.loaded_adapters == {}


def _symlink_member() -> bytes:
    link = stored("adapter_model.safetensors", b"/etc/passwd")
    link = type(link)(**{**link.__dict__, "external_attr": (stat.S_IFLNK | 0o777) << 16})
    config = stored("adapter_config.json", adapter_files()["adapter_config.json"])
    return raw_zip([config, link])


def _with(name: str, data: bytes) -> bytes:
    return raw_zip([stored(name, data), *[stored(n, d) for n, d in adapter_files().items()]])


# case -> (adapter name, body, what the error names)
HOSTILE = {
    "not a zip": ("a", b"this is not an archive", "not a readable zip"),
    "a traversal path": ("a", _with("../../evil.json", b"{}"), "unsafe path"),
    "an absolute path": ("a", _with("/tmp/evil.json", b"{}"), "unsafe path"),
    "a symlink member": ("a", _symlink_member(), "not a regular file"),
    "no weights": ("a", zip_of({"adapter_config.json": b'{"r": 4}'}), "needs"),
    "a name with a control character": ("bad%01name", zip_of(adapter_files()), "control"),
    "a name over the length cap": ("n" * 600, zip_of(adapter_files()), "longer than"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_pushes_are_4xx_and_leave_nothing_behind(servers: list[Served], case: str) -> None:
    one = servers[0]
    name, body, says = HOSTILE[case]
    response = _put(one.url, name, body, **AUTH)
    _assert_openai_error(response, 400)
    assert says in response.json()["error"]["message"]
    assert one.fake.loaded_adapters == {}
    assert list(one.server.adapter_routes.root.iterdir()) == []


def test_an_oversized_body_is_a_413_declared_or_not(servers: list[Served]) -> None:
    one = servers[0]
    routes = one.server.adapter_routes
    cap, routes.max_bytes = routes.max_bytes, 4096
    try:
        _assert_openai_error(_put(one.url, "a", bytes(8192), **AUTH), 413)

        def chunks() -> Iterator[bytes]:  # no content-length: the server counts as it reads
            for _ in range(8):
                yield bytes(1024)

        response = httpx.put(f"{one.url}/internal/adapters/a", content=chunks(), headers=AUTH)
        assert "content-length" not in response.request.headers
        _assert_openai_error(response, 413)
    finally:
        routes.max_bytes = cap
    assert one.fake.loaded_adapters == {}
    assert list(routes.root.iterdir()) == []


def _client(served: Served) -> RemoteEngineClient:
    return RemoteEngineClient(
        served.url, token=TOKEN, tokenizer=ByteTokenizer(), info=fetch_info(served.url, TOKEN)
    )


def test_a_pushed_adapter_loads_counts_its_requests_and_unloads(
    servers: list[Served], tmp_path: Path
) -> None:
    one = servers[0]
    files = adapter_files()
    folder = _folder(tmp_path / "peft", files)

    async def main() -> None:
        client = _client(one)
        try:
            info = await client.load_adapter("my-lora", folder)
            assert info.rank == 4 and info.alpha == 8.0
            weights, config = files["adapter_model.safetensors"], files["adapter_config.json"]
            assert info.digest == hashlib.sha256(weights + config).hexdigest()
            assert client.adapters() == [info] and client.has_adapter("my-lora")
            # The engine got a copy in the server's own folder, not the gateway's path.
            (unpacked,) = [p for p in one.server.adapter_routes.root.iterdir()]
            assert sorted(p.name for p in unpacked.iterdir()) == sorted(files)
            await client.poll_once()
            assert client.adapters() == [info]  # the poll carries the same listing
            assert client.info.device == "cpu" and client.info.dtype == "float32"
            listed = httpx.get(f"{one.url}/internal/adapters", headers=AUTH).json()
            assert [a["name"] for a in listed["adapters"]] == ["my-lora"]

            request = EngineRequest(
                prompt_token_ids=(1, 2, 3),
                params=SamplingParams(max_tokens=2, temperature=0),
                adapter="my-lora",
            )
            async for _event in client.submit(request):
                pass
            metrics = httpx.get(f"{one.url}/metrics").text
            assert (
                'cloister_adapter_requests_total{adapter="my-lora",model_name="tiny"} 1.0'
                in metrics
            )
            assert 'vllm:lora_requests_info{max_lora="0"' in metrics

            one.fake.pinned_adapters.add("my-lora")
            # The same files again (another gateway's push): the loaded record, no reload,
            # so no refusal while in use.
            loads = one.fake.loads
            assert await client.load_adapter("my-lora", folder) == info
            assert one.fake.loads == loads
            with pytest.raises(AdapterInUseError, match="in use"):
                await client.unload_adapter("my-lora")
            response = httpx.delete(f"{one.url}/internal/adapters/my-lora", headers=AUTH)
            _assert_openai_error(response, 409)
            one.fake.pinned_adapters.clear()
            await client.unload_adapter("my-lora")
            assert client.adapters() == [] and one.fake.loaded_adapters == {}
            assert list(one.server.adapter_routes.root.iterdir()) == []  # its files went
        finally:
            await client.shutdown()

    asyncio.run(main())


def _registry(tmp_path: Path, folder: str) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    upgrade_database(url)
    sessions = make_session_factory(make_engine(url))
    with sessions() as s:
        registry.register_model(s, name="tiny", source="/x", format="gguf", context_length=64)
        registry.register_adapter(s, name="a", base_model="tiny", rank=4, source_path=folder)
    return sessions


def test_a_replica_set_loads_everywhere_and_the_sync_heals_a_restarted_replica(
    servers: list[Served], tmp_path: Path
) -> None:
    first, second = servers
    folder = _folder(tmp_path / "peft")
    sessions = _registry(tmp_path, folder)

    async def main() -> None:
        replicas = ReplicaSetClient(
            [s.url for s in servers],
            token=TOKEN,
            tokenizer=ByteTokenizer(),
            model_name="tiny",
            resolve=lambda urls: list(urls),
            poll_s=60,
        )
        sync = AdapterSync(replicas, sessions, interval_s=0)
        clients = replicas.replicas()

        async def poll() -> None:
            for c in clients:
                await c.poll_once()

        try:
            await poll()
            # Each replica's own device and dtype (the set was built with the first's info).
            states = replicas.replica_states()
            assert [(s.device, s.dtype) for s in states] == [
                ("cpu", "float32"),
                ("cpu", "bfloat16"),
            ]
            assert await sync.sync_once() is True
            assert set(first.fake.loaded_adapters) == set(second.fake.loaded_adapters) == {"a"}
            assert [a.name for a in replicas.adapters()] == ["a"]

            # The second replica restarts: it comes back without the adapter.
            digest = first.fake.loaded_adapters["a"].digest
            second.fake.forget_adapters()
            await poll()
            assert replicas.adapters() == [] and replicas.partly_loaded_adapters() == ["a"]
            request = EngineRequest(prompt_token_ids=(1, 2), params=SamplingParams(), adapter="a")
            assert [c.base_url for c in replicas.route(request)] == [first.url]
            first.fake.pinned_adapters.add("a")  # in use on the first: a reload there fails
            try:
                assert await sync.sync_once() is True  # loaded on the second only
            finally:
                first.fake.pinned_adapters.clear()
            assert second.fake.loaded_adapters["a"].digest == digest
            await poll()
            assert [a.name for a in replicas.adapters()] == ["a"]

            # Retired: unloaded wherever it is, even when one replica refuses at first.
            with sessions() as s:
                s.execute(update(LoraAdapter).values(status="retired"))
                s.commit()
            first.fake.pinned_adapters.add("a")
            try:
                await sync.sync_once()
            finally:
                first.fake.pinned_adapters.clear()
            assert set(first.fake.loaded_adapters) == {"a"} and not second.fake.loaded_adapters
            await poll()
            assert replicas.partly_loaded_adapters() == ["a"]
            assert await sync.sync_once() is True
            assert not first.fake.loaded_adapters
        finally:
            await replicas.shutdown()

    asyncio.run(main())
