"""Hostile adapter uploads and model sources against a live admin server (issue 13, items 9, 17).

Every malformed archive is a clear, audited 400 in the OpenAI error format; a zip
bomb never inflates in memory; the server answers other requests while an upload
is being checked; a source that is a FIFO, or lies outside the model roots, is
refused without being opened; an oversize body is refused on its Content-Length
and while it streams.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import socket
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from admin import registry
from admin.app import create_admin_app
from admin.deps import UPLOAD_CONCURRENCY
from admin.models import AuditEvent, LoraAdapter
from gateway.errors import install_error_handlers
from tests.admin.zip_archives import (
    GIB,
    HEADS,
    HIDDEN,
    HOSTILE,
    INTERMEDIATE,
    KV_HEADS,
    adapter_files,
    zip_of,
)
from tests.utils.admin_env import AdminEnv, make_env
from tests.utils.services import free_port

P = "/admin/api/v1"
UPLOAD_CAP = 8 * 1024 * 1024
RSS_GROWTH_LIMIT = 200 * 1024 * 1024
LAYERS = 2
# The registered base model's config.json: a Llama the engine could load (no weights).
BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 64,
    "num_hidden_layers": LAYERS,
    "hidden_size": HIDDEN,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "intermediate_size": INTERMEDIATE,
}


@dataclass
class Live:
    """An admin app served by uvicorn on a thread, with the OpenAI error handlers of `serve`."""

    env: AdminEnv
    url: str
    headers: dict[str, str]
    roots: Path

    def post(self, path: str, timeout: float = 30.0, **request: Any) -> httpx.Response:
        """POSTs to the admin API's `path` as the admin (`request`: httpx's arguments)."""
        return httpx.post(f"{self.url}{P}{path}", headers=self.headers, timeout=timeout, **request)

    def upload(self, body: bytes, name: str, timeout: float = 60.0) -> httpx.Response:
        """POSTs `body` as the adapter zip for adapter `name` of base model "base"."""
        params = {"name": name, "base_model": "base"}
        return self.post("/adapters/upload", timeout, params=params, content=body)

    def outcomes(self, resource: str) -> list[str]:
        """Audit outcomes recorded for `resource`, oldest first."""
        self.env.services.audit_writer.flush()  # records are written in the background
        with self.env.sessions() as s:
            rows = s.query(AuditEvent).filter(AuditEvent.resource == resource)
            return [e.outcome for e in rows.order_by(AuditEvent.seq)]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """One server for the module; every test uses its own adapter and model names."""
    tmp_path = tmp_path_factory.mktemp("adapter-upload")
    env = make_env(tmp_path, adapter_upload_max_bytes=UPLOAD_CAP)
    roots = tmp_path / "models"
    base = roots / "base-hf"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(BASE_CONFIG))
    with env.sessions() as s:
        registry.register_model(
            s, name="base", source=str(base), format="safetensors", context_length=64
        )
    app = create_admin_app(env.services)
    install_error_handlers(app)  # as `cloister serve` does for the admin router it mounts
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "admin server did not start"
        time.sleep(0.02)
    yield Live(env, f"http://127.0.0.1:{port}", env.token("admin"), roots)
    server.should_exit = True
    thread.join(30)
    env.client.close()


def assert_openai_400(r: httpx.Response) -> None:
    """A 400 with the OpenAI error body."""
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


# ---------------------------------------------------------------- tests


def test_a_valid_adapter_is_registered(live: Live) -> None:
    r = live.upload(zip_of(adapter_files(), folder="my-adapter/"), "good")
    assert r.status_code == 201, r.text
    with live.env.sessions() as s:
        row = s.query(LoraAdapter).filter(LoraAdapter.name == "good").one()
        folder = Path(row.source_path)
    assert row.rank == 4
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert live.outcomes("adapters/good") == ["success"]
    again = live.upload(zip_of(adapter_files()), "good")
    assert again.status_code == 409 and again.json()["error"]["message"]
    params = {"name": "orphan", "base_model": "missing"}
    no_base = live.post("/adapters/upload", params=params, content=zip_of(adapter_files()))
    assert no_base.status_code == 404
    assert live.outcomes("adapters/good") == ["success", "error"]
    assert live.outcomes("adapters/orphan") == ["error"]
    # The uploads' temporary files are gone.
    assert list((live.env.tmp / "uploads").iterdir()) == []


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_an_audited_400(live: Live, case: str) -> None:
    name = f"bad-{case}"
    stored_before = _stored_adapters(live)
    r = live.upload(HOSTILE[case](), name)
    assert_openai_400(r)
    assert live.outcomes(f"adapters/{name}") == ["invalid"]
    with live.env.sessions() as s:
        assert s.query(LoraAdapter).filter(LoraAdapter.name == name).count() == 0
    assert _stored_adapters(live) == stored_before
    assert list((live.env.tmp / "uploads").iterdir()) == []


def _stored_adapters(live: Live) -> set[str]:
    folder = live.env.tmp / "adapters"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("case", ["zip_bomb", "lying_header_bomb"])
def test_a_bomb_does_not_inflate_in_memory(live: Live, case: str) -> None:
    body = HOSTILE[case]()
    peak = baseline = _rss()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        r = live.upload(body, f"bomb-{case}")
    finally:
        done.set()
        sampler.join()
    assert peak - baseline < RSS_GROWTH_LIMIT, f"RSS grew by {(peak - baseline) >> 20} MiB"
    assert_openai_400(r)


class ArchiveHold:
    """Holds the server's looks at uploaded archives (opening one with zipfile, or reading
    its end records) until `release`; records what happened in `events`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        self.reached, self._released = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self.held = 0  # calls held so far
        targets: list[tuple[Any, str]] = [(zipfile.ZipFile, "__init__")]
        targets.append((importlib.import_module("engine.lora.archive"), "central_directory_size"))
        for owner, attr in targets:
            monkeypatch.setattr(owner, attr, self._wrap(getattr(owner, attr)))

    def _wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.held += 1
            self.reached.set()
            resumed = self._released.wait(20)
            self.events.append("check resumed" if resumed else "check gave up waiting")
            return real(*args, **kwargs)

        return held

    def release(self) -> None:
        """Lets the held check go on."""
        self._released.set()


@pytest.mark.parametrize("case", ["zip_bomb", "50k_entries"])
def test_the_server_answers_while_an_upload_is_checked(
    live: Live, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is held at its first look at the archive until another request was answered;
    checked on the event loop (the defect), that request could not be answered meanwhile."""
    body = HOSTILE[case]()
    hold = ArchiveHold(monkeypatch)  # after building the body, which may use zipfile itself
    result: list[httpx.Response] = []
    uploader = threading.Thread(target=lambda: result.append(live.upload(body, f"held-{case}")))
    uploader.start()
    assert hold.reached.wait(60), "the upload never reached its archive check"
    r = httpx.get(f"{live.url}{P}/whoami", headers=live.headers, timeout=60)
    hold.events.append("other request answered")
    hold.release()
    uploader.join(60)
    assert r.status_code == 200
    assert hold.events[:2] == ["other request answered", "check resumed"]
    assert_openai_400(result[0])


def test_uploads_beyond_the_concurrency_bound_are_refused(
    live: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = zip_of(adapter_files())
    hold = ArchiveHold(monkeypatch)
    results: list[httpx.Response] = []
    uploaders = [
        threading.Thread(target=lambda i=i: results.append(live.upload(body, f"slot-{i}")))
        for i in range(UPLOAD_CONCURRENCY)
    ]
    for t in uploaders:
        t.start()
    assert hold.reached.wait(60)
    deadline = time.monotonic() + 60
    while hold.held < UPLOAD_CONCURRENCY and time.monotonic() < deadline:
        time.sleep(0.01)
    refused = live.upload(body, "slot-extra")
    hold.release()
    for t in uploaders:
        t.join(60)
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert live.outcomes("adapters/slot-extra") == ["busy"]
    assert sorted(r.status_code for r in results) == [201] * UPLOAD_CONCURRENCY


def _raw_request(live: Live, head: bytes, body_parts: list[bytes]) -> bytes:
    """Sends a hand-written request and returns the first bytes of the response."""
    with socket.create_connection(("127.0.0.1", int(live.url.rsplit(":", 1)[1])), 30) as sock:
        sock.settimeout(30)
        sock.sendall(head)
        for part in body_parts:
            try:
                sock.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered and closed early: what it said is read below
        return sock.recv(4096)


def _upload_head(live: Live, name: str, extra: str) -> bytes:
    token = live.headers["Authorization"]
    return (
        f"POST {P}/adapters/upload?name={name}&base_model=base HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nAuthorization: {token}\r\n{extra}\r\n"
    ).encode()


def test_a_lying_content_length_is_refused_before_the_body(live: Live) -> None:
    # Claims 100 GB and sends nothing: refused on the header, without waiting for a byte.
    head = _upload_head(live, "claims-huge", f"Content-Length: {100 * GIB}\r\n")
    reply = _raw_request(live, head, [])
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert live.outcomes("adapters/claims-huge") == ["invalid"]


def test_an_oversize_streamed_body_is_cut_off(live: Live) -> None:
    # Chunked, no Content-Length: the cap is enforced on the bytes as they arrive.
    chunk = b"\0" * (1 << 20)
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    parts = [framed] * (2 * UPLOAD_CAP // len(chunk)) + [b"0\r\n\r\n"]
    reply = _raw_request(
        live, _upload_head(live, "streams-huge", "Transfer-Encoding: chunked\r\n"), parts
    )
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert live.outcomes("adapters/streams-huge") == ["invalid"]
    assert list((live.env.tmp / "uploads").iterdir()) == []


# ---------------------------------------------------------------- sources


def _unblock_fifo(path: Path) -> None:
    # If the server did open the FIFO (the defect), give its reader a writer so that it returns.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _register_model(live: Live, source: str, name: str) -> httpx.Response:
    model = {"name": name, "source": source, "format": "gguf", "context_length": 8}
    return live.post("/models", json=model)


def test_model_sources_must_be_regular_files_under_the_roots(live: Live) -> None:
    fifo = live.roots / "pipe.gguf"
    os.mkfifo(fifo)
    outside = live.env.tmp / "outside.gguf"
    outside.write_bytes(b"GGUF")
    escape = live.roots / "escape.gguf"
    escape.symlink_to(outside)
    folder = live.roots / "hf-with-fifo"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    os.mkfifo(folder / "model.safetensors")
    inside = live.roots / "ok.gguf"
    inside.write_bytes(b"GGUF")
    try:
        cases = {
            "fifo": str(fifo),
            "outside": str(outside),
            "symlink-escape": str(escape),
            "dotdot-escape": str(live.roots / ".." / "outside.gguf"),
            "folder-with-fifo": str(folder),
            "missing": str(live.roots / "missing.gguf"),
            "device": "/dev/zero",
        }
        for case, source in cases.items():
            r = _register_model(live, source, f"m-{case}")
            assert_openai_400(r)
            assert live.outcomes(f"models/m-{case}") == ["invalid"], case
        assert _register_model(live, str(inside), "m-ok").status_code == 201
        adapter = {"name": "a-fifo", "base_model": "base", "rank": 4, "source_path": str(fifo)}
        r = live.post("/adapters", json=adapter)
        assert_openai_400(r)
        assert live.outcomes("adapters/a-fifo") == ["invalid"]
    finally:
        _unblock_fifo(fifo)
        _unblock_fifo(folder / "model.safetensors")


def test_an_upload_never_opens_a_fifo_base_model(live: Live) -> None:
    # A base model registered (by an older release, or straight in the database) with a FIFO
    # source: reading its shapes would block forever, so the upload is refused unread.
    fifo = live.roots / "base-pipe.gguf"
    os.mkfifo(fifo)
    with live.env.sessions() as s:
        registry.register_model(s, name="pipe", source=str(fifo), format="gguf", context_length=8)
    try:
        params = {"name": "on-pipe", "base_model": "pipe"}
        r = live.post("/adapters/upload", params=params, content=zip_of(adapter_files()))
        assert_openai_400(r)
        assert live.outcomes("adapters/on-pipe") == ["invalid"]
    finally:
        _unblock_fifo(fifo)


def test_adapter_registration_refuses_nonsense_fields(live: Live) -> None:
    folder = live.roots / "peft"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")

    def register(**changes: Any) -> httpx.Response:
        body = {"name": "reg", "base_model": "base", "rank": 4, "source_path": str(folder)}
        return live.post("/adapters", json={**body, **changes})

    for changes in ({"rank": 10**30}, {"rank": 0}, {"rank": 5000}, {"name": "n" * 200}):
        r = register(**changes)
        assert 400 <= r.status_code < 500, (changes, r.status_code, r.text[:200])
        assert r.json()["error"]["message"]
    assert_openai_400(live.upload(zip_of(adapter_files()), "n" * 200))
    assert register().status_code == 201


def test_a_folder_source_is_checked_through_its_symlinks(live: Live) -> None:
    hidden = live.roots / "hidden"
    hidden.mkdir()
    os.mkfifo(hidden / "weights.safetensors")
    folder = live.roots / "hf-linked"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "shards").symlink_to(hidden, target_is_directory=True)
    loop = live.roots / "hf-loop"
    loop.mkdir()
    (loop / "config.json").write_text("{}")
    (loop / "again").symlink_to(loop, target_is_directory=True)
    try:
        assert_openai_400(_register_model(live, str(folder), "m-linked-fifo"))
        assert_openai_400(_register_model(live, str(loop), "m-loop"))
    finally:
        _unblock_fifo(hidden / "weights.safetensors")


A_KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B_KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"


def _weights(dtype: str, bad: tuple[str, float] | None = None) -> bytes:
    """The q_proj adapter of `adapter_files` with random weights in `dtype` (torch's name),
    one value of tensor `bad[0]` set to `bad[1]`."""
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(0)
    tensors = {
        A_KEY: torch.randn(4, HIDDEN, generator=g),
        B_KEY: torch.randn(HIDDEN, 4, generator=g),
    }
    if bad is not None:
        tensors[bad[0]][1, 2] = bad[1]
    return save({k: t.to(getattr(torch, dtype)).contiguous() for k, t in tensors.items()})


@pytest.mark.parametrize(
    ("dtype", "key", "value"),
    [
        ("float16", B_KEY, float("nan")),
        ("bfloat16", A_KEY, float("inf")),
        ("float32", B_KEY, -float("inf")),
        ("float64", A_KEY, float("nan")),
    ],
)
def test_an_adapter_with_non_finite_weights_is_an_audited_400(
    live: Live, dtype: str, key: str, value: float
) -> None:
    # Issue 46: a NaN adapter's requests are NaN; refused at upload, naming the tensor.
    name = f"nonfinite-{dtype}"
    stored_before = _stored_adapters(live)
    files = {**adapter_files(), "adapter_model.safetensors": _weights(dtype, (key, value))}
    r = live.upload(zip_of(files), name)
    assert_openai_400(r)
    message = r.json()["error"]["message"]
    assert key in message and "non-finite" in message, message
    assert live.outcomes(f"adapters/{name}") == ["invalid"]
    with live.env.sessions() as s:
        assert s.query(LoraAdapter).filter(LoraAdapter.name == name).count() == 0
    assert _stored_adapters(live) == stored_before
    assert list((live.env.tmp / "uploads").iterdir()) == []
    # The same adapter with finite weights (largest and smallest values included) passes.
    extremes = {**adapter_files(), "adapter_model.safetensors": _weights(dtype, (key, -6e4))}
    assert live.upload(zip_of(extremes), f"finite-{dtype}").status_code == 201


def test_the_finiteness_scan_reads_every_float_dtype(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from admin.adapter_upload import _check_finite
    from admin.errors import AdapterValidationError

    specials = {
        "float64": [float("nan"), float("inf")],
        "float32": [float("nan"), -float("inf")],
        "float16": [float("nan"), float("inf")],
        "bfloat16": [float("nan"), -float("inf")],
        "float8_e5m2": [float("nan"), float("inf")],
        "float8_e4m3fn": [float("nan")],  # no infinity in e4m3fn
    }
    path = tmp_path / "w.safetensors"
    for dtype, values in specials.items():
        finite = torch.tensor([[0.0, -0.0, 1.5, -2.0, 1e-3, 240.0]] * 3).to(getattr(torch, dtype))
        extra = {"not_lora.weight": torch.full((2,), float("nan"))}  # not a LoRA tensor: ignored
        save_file({B_KEY: torch.zeros(3, 5), A_KEY: finite, **extra}, str(path))
        _check_finite(path)
        for value in values:
            bad = finite.clone()
            bad[2, 5] = value
            save_file({B_KEY: torch.zeros(3, 5), A_KEY: bad}, str(path))
            with pytest.raises(AdapterValidationError, match="lora_A.weight has non-finite"):
                _check_finite(path)
    save_file({A_KEY: torch.ones(2, 2, dtype=torch.int8)}, str(path))
    _check_finite(path)  # integers are always finite


# ------------------------------------------------- what the engine would refuse (issue 46)

LAYER0 = "base_model.model.model.layers.0"


def _tensors(extra: dict[str, tuple[int, ...]], drop: str | None = None) -> bytes:
    """The q_proj adapter of `adapter_files` (rank 4) plus zero tensors of `extra`'s shapes."""
    import numpy as np
    from safetensors.numpy import save

    tensors = {A_KEY: np.zeros((4, HIDDEN), np.float16), B_KEY: np.zeros((HIDDEN, 4), np.float16)}
    tensors.update({k: np.zeros(shape, np.float16) for k, shape in extra.items()})
    return save({k: v for k, v in tensors.items() if k != drop})


# name -> (adapter files, a phrase the refusal must contain)
ENGINE_REFUSES: dict[str, tuple[Callable[[], dict[str, bytes]], str]] = {
    "rank_over_max_lora_rank": (lambda: adapter_files(rank=32), "max_lora_rank"),
    "embedding_target": (
        lambda: {
            **adapter_files(),
            "adapter_model.safetensors": _tensors(
                {
                    "base_model.model.model.embed_tokens.lora_embedding_A": (4, 64),
                    "base_model.model.model.embed_tokens.lora_embedding_B": (HIDDEN, 4),
                }
            ),
        },
        "embed_tokens",
    ),
    "layer_beyond_the_model": (
        lambda: {
            **adapter_files(),
            "adapter_model.safetensors": _tensors(
                {
                    f"base_model.model.model.layers.{LAYERS}.self_attn.q_proj.lora_A.weight": (
                        4,
                        HIDDEN,
                    ),
                    f"base_model.model.model.layers.{LAYERS}.self_attn.q_proj.lora_B.weight": (
                        HIDDEN,
                        4,
                    ),
                }
            ),
        },
        f"layers.{LAYERS}.",
    ),
    "k_proj_shaped_as_q_proj": (
        lambda: {
            **adapter_files(),
            "adapter_model.safetensors": _tensors(
                {
                    f"{LAYER0}.self_attn.k_proj.lora_A.weight": (4, HIDDEN),
                    f"{LAYER0}.self_attn.k_proj.lora_B.weight": (HIDDEN, 4),  # kv_out is 8
                }
            ),
        },
        "k_proj",
    ),
    "lora_A_without_lora_B": (
        lambda: {**adapter_files(), "adapter_model.safetensors": _tensors({}, drop=B_KEY)},
        "lora_B",
    ),
    "negative_alpha": (
        lambda: adapter_files(
            {"r": 4, "base_model_name_or_path": "base", "peft_type": "LORA", "lora_alpha": -8}
        ),
        "lora_alpha",
    ),
    "dora": (
        lambda: adapter_files(
            {"r": 4, "base_model_name_or_path": "base", "peft_type": "LORA", "use_dora": True}
        ),
        "LoRA",
    ),
    "trained_bias": (
        lambda: adapter_files(
            {"r": 4, "base_model_name_or_path": "base", "peft_type": "LORA", "bias": "all"}
        ),
        "bias",
    ),
}


@pytest.mark.parametrize("case", sorted(ENGINE_REFUSES))
def test_an_adapter_the_engine_would_refuse_is_an_audited_400(
    live: Live, case: str, tmp_path: Path
) -> None:
    # Issue 46: the upload applies the engine's own checks against the base model's
    # shape (rank within max_lora_rank, known targets, layers, shapes), so that no
    # registered adapter is one every engine then refuses to load.
    from engine.errors import InvalidAdapterError
    from engine.lora.peft import read_peft_adapter
    from engine.model.hf_loader import architecture_from_config

    make, phrase = ENGINE_REFUSES[case]
    files = make()
    name = f"engine-refuses-{case}"
    stored_before = _stored_adapters(live)
    r = live.upload(zip_of(files), name)
    assert_openai_400(r)
    assert phrase in r.json()["error"]["message"], r.text
    assert live.outcomes(f"adapters/{name}") == ["invalid"]
    with live.env.sessions() as s:
        assert s.query(LoraAdapter).filter(LoraAdapter.name == name).count() == 0
    assert _stored_adapters(live) == stored_before
    assert list((live.env.tmp / "uploads").iterdir()) == []
    # ... and the engine itself refuses the same folder for the same base model.
    for file, data in files.items():
        (tmp_path / file).write_bytes(data)
    with pytest.raises(InvalidAdapterError):
        read_peft_adapter(name, tmp_path, architecture_from_config(BASE_CONFIG), 16)


def test_an_adapter_on_every_projection_of_every_layer_is_accepted(live: Live) -> None:
    in_out = {
        "self_attn.q_proj": (HIDDEN, HIDDEN),
        "self_attn.k_proj": (HIDDEN, 8),
        "self_attn.v_proj": (HIDDEN, 8),
        "self_attn.o_proj": (HIDDEN, HIDDEN),
        "mlp.gate_proj": (HIDDEN, INTERMEDIATE),
        "mlp.up_proj": (HIDDEN, INTERMEDIATE),
        "mlp.down_proj": (INTERMEDIATE, HIDDEN),
    }
    rank = 16  # max_lora_rank itself
    extra: dict[str, tuple[int, ...]] = {}
    for layer in range(LAYERS):
        for module, (fan_in, fan_out) in in_out.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            extra[f"{prefix}.lora_A.weight"] = (rank, fan_in)
            extra[f"{prefix}.lora_B.weight"] = (fan_out, rank)
    files = adapter_files(rank=rank)
    files["adapter_model.safetensors"] = _full(extra)
    r = live.upload(zip_of(files), "every-projection")
    assert r.status_code == 201, r.text
    assert r.json()["rank"] == rank


def _full(shapes: dict[str, tuple[int, ...]]) -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({k: np.zeros(shape, np.float16) for k, shape in shapes.items()})
