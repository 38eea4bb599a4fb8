"""ProcessEngine: the engine loop in a child process, the same front as AsyncEngine.

    parent (event loop)                            child process "cloister-engine"
    submit() --framed AddRequest--> socket -->     reader thread --> EngineLoop inbox
    streams <-- _on_readable <-- socket <--        EngineLoop sink: one StepReport per step

Messages are pickled and framed by `engine.fronts.frames` over a socket pair: the parent
takes every report that has arrived with one `recv` per wake-up.

With `AsyncEngine` the engine thread shares one GIL with the caller's event loop:
under load each waits for the other (the gateway's HTTP work delays engine steps,
and steps delay responses). A child process has its own interpreter, so the only
cost left is one pickled message per request and one per engine step.

The child builds its engine with a picklable factory (spawned, never forked: the
parent may hold threads, CUDA state and an event loop). The parent receives the
engine's figures and its tokenizer in the first message, so that it validates,
counts and templates without loading any weights. Each side notices the other's
death: the child stops when its socket closes; the parent ends every live request
with `EngineDeadError` when the child's end closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.errors import EngineDeadError, EngineError
from engine.fronts.async_engine import EngineFront
from engine.fronts.core_loop import STOP, EngineInfo, EngineLoop, InboxItem, StepReport, Stop
from engine.fronts.frames import FrameDecoder, encode_frame
from engine.llm_engine import LLMEngine
from engine.model.tokenizer import Tokenizer
from engine.stats import EngineStats

log = logging.getLogger("engine.process")

EngineFactory = Callable[[], LLMEngine]

# Joining a child that does not stop by itself (a step stuck in a kernel) ends in kill.
STOP_TIMEOUT_S = 10.0
# The most one `recv` takes; more waiting means another wake-up of the reader.
RECV_BYTES = 1 << 20


class EngineStartError(EngineError):
    """The engine process could not build its engine."""


@dataclass(frozen=True)
class Ready:
    """The child's first message: what the parent needs to serve without the weights."""

    info: EngineInfo
    tokenizer: Tokenizer
    stats: EngineStats


@dataclass(frozen=True)
class Failed:
    """The child's last message when building or running the engine failed."""

    message: str


def engine_process_main(factory: EngineFactory, sock: socket.socket) -> None:
    """The child: builds the engine, then serves its inbox until told to stop."""
    # Ctrl-C reaches the whole process group: the parent decides when the engine stops
    # (after its server has drained), so the child must not die of it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        engine = factory()
    except BaseException as exc:  # report why, whatever it was, then exit
        log.exception("the engine process could not build its engine")
        with contextlib.suppress(OSError):
            sock.sendall(encode_frame(Failed(f"{type(exc).__name__}: {exc}")))
        return

    def sink(report: StepReport) -> None:
        # Events leave their prompt behind: the parent has it, and a whole prompt per
        # request per step would dominate what is pickled.
        events = tuple(e.with_prompt(()) for e in report.events)
        sock.sendall(encode_frame(dataclasses.replace(report, events=events)))
        # Where the parent shares this CPU, the OS would keep stepping here through the
        # time slice and the parent would read the tokens in bunches, the first with
        # the last (bench/engine_hop.py --engine-mode process: TTFT p50 2.7 ms over the
        # link, against 0.9 with the yield). With a CPU of its own, a yield is a no-op.
        os.sched_yield()

    # The engine lives as long as the process: out of the collector's walk, a full
    # collection no longer pauses a step for tens of milliseconds.
    gc.collect()
    gc.freeze()
    core = EngineLoop(engine, sink)
    sock.sendall(encode_frame(Ready(EngineInfo.of(engine), engine.tokenizer, engine.stats())))

    def read_inbox() -> None:
        # The parent's messages arrive even while a step runs; a closed socket (the
        # parent exited or was killed) stops the engine.
        decoder = FrameDecoder()
        while True:
            try:
                data = sock.recv(RECV_BYTES)
            except OSError:
                data = b""
            if not data:
                core.put(STOP)
                return
            for item in decoder.feed(data):
                core.put(item)  # type: ignore[arg-type]  # the parent sends only InboxItems
                if isinstance(item, Stop):
                    return

    threading.Thread(target=read_inbox, name="cloister-engine-inbox", daemon=True).start()
    try:
        core.run()
    except BaseException as exc:
        log.exception("engine loop died")
        with contextlib.suppress(OSError):
            sock.sendall(encode_frame(Failed(f"the engine loop died: {type(exc).__name__}: {exc}")))


class ProcessEngine(EngineFront):
    """Streams requests through an `LLMEngine` that lives in a child process.

    The constructor blocks until the child has built its engine (loading the model),
    and raises `EngineStartError` with the child's reason when it could not.
    """

    events_carry_prompts = False

    def __init__(self, factory: EngineFactory, *, start_timeout_s: float = 900.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._sock, child_sock = socket.socketpair()
        self._decoder = FrameDecoder()
        self._process = ctx.Process(
            target=engine_process_main,
            args=(factory, child_sock),
            name="cloister-engine",
            daemon=True,
        )
        # The child keeps libgomp's default wait policy: its workers spin a little between
        # parallel ops, then sleep. A passive policy (sleep at once) made every op of a
        # step wait for a worker to wake: 66 vs 41 ms served ITL on 2 cores.
        self._process.start()
        child_sock.close()  # the child's copy is the only one left: its exit means EOF here
        first = self._receive_first(start_timeout_s)
        super().__init__(first.info, first.tokenizer, first.stats)
        self._reading = False

    def _receive_first(self, timeout_s: float) -> Ready:
        try:
            first = self._read_first(timeout_s)
        except EngineStartError:
            self._kill()
            raise
        if isinstance(first, Failed):
            self._process.join(STOP_TIMEOUT_S)
            self._sock.close()
            raise EngineStartError(first.message)
        assert isinstance(first, Ready)
        return first

    def _read_first(self, timeout_s: float) -> object:
        """The child's first message (blocking: no event loop runs yet)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                self._sock.settimeout(left)
                data = self._sock.recv(RECV_BYTES)
            except TimeoutError:
                raise EngineStartError(
                    f"the engine process was not ready in {timeout_s:g} s"
                ) from None
            except OSError as exc:
                raise EngineStartError("the engine process exited while starting") from exc
            if not data:
                raise EngineStartError("the engine process exited while starting")
            # The child sends nothing after its first message until it is given work.
            messages = self._decoder.feed(data)
            if messages:
                self._sock.settimeout(None)
                return messages[0]

    @property
    def pid(self) -> int | None:
        """The engine process's id."""
        return self._process.pid

    async def start(self) -> None:
        """Starts reading the child's reports on the running event loop."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        self._reading = True

    async def shutdown(self) -> None:
        """Stops the child; live requests end with an error."""
        self._stopping = True
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                self._sock.sendall(encode_frame(STOP))
            await asyncio.to_thread(self._process.join, STOP_TIMEOUT_S)
        self._close(None)
        self._kill()

    def _running(self) -> bool:
        return self._reading

    def _send(self, item: InboxItem) -> None:
        try:
            self._sock.sendall(encode_frame(item))
        except OSError as exc:
            self._close(EngineDeadError("the engine process is gone"))
            raise EngineDeadError("the engine process is gone") from exc

    def _on_readable(self) -> None:
        # The socket is readable: this `recv` returns at once, with every byte there.
        try:
            data = self._sock.recv(RECV_BYTES)
        except OSError:
            data = b""
        if not data:
            self._close(None if self._stopping else EngineDeadError("the engine process exited"))
            return
        try:
            messages = self._decoder.feed(data)
        except Exception:
            # The streams of a report that cannot be read are in an unknown state: end
            # them all now (the engine is gone) rather than leave them waiting forever.
            log.exception("a message from the engine process could not be read")
            self._close(EngineDeadError("the engine process sent an unreadable message"))
            self._kill()
            return
        for message in messages:
            if isinstance(message, StepReport):
                self._on_report(message)
            elif isinstance(message, Failed):
                self._close(EngineDeadError(message.message))
                return

    def _close(self, reason: BaseException | None) -> None:
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        self._on_dead(reason)

    def _kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(STOP_TIMEOUT_S)
        self._sock.close()
