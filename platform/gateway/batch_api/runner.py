"""The background worker that runs every tenant's batches, line by line.

One task per active batch walks its input file and sends each line that has no
result yet through the gateway app (`line_call`); at most `concurrency` lines are in
flight across all batches, taken in turns (a FIFO semaphore), so one tenant's large
batch does not hold back another's. A line's result is stored before it counts as
done; a batch whose lines are all done is finalized: its output and error files are
written (under fixed ids, so a finalization redone after a crash replaces them).

Lines the engine refuses as overloaded (503) are retried after a pause: batch work
fills capacity interactive work leaves, so a full engine means "later", not "failed".
So is a file store that cannot be reached (the input cannot be read, or the output not
written): the batch stays active and is taken up again at the next poll, until its
window passes; then it ends "expired" with an error naming the store.
On shutdown the lines in flight are stopped unbilled and run again at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
from starlette.types import ASGIApp

from gateway.batch_api.batch_lines import LineError, parse_line, read_lines
from gateway.batch_api.batch_store import BatchInfo, BatchStore, line_request_id
from gateway.batch_api.blob_store import FileStoreUnavailableError
from gateway.batch_api.errors import ResourceNotFoundError
from gateway.batch_api.file_store import FileStore
from gateway.batch_api.line_call import BatchLineIdentity, LineResponse, call_line
from tenancy.errors import AuthenticationError
from tenancy.models import utcnow
from tenancy.principal import Principal

logger = logging.getLogger("cloister.batches")

PrincipalOfKey = Callable[[str], Principal]  # blocking; AuthenticationError if unusable
RETRY_STATUSES = frozenset({429, 503})
RETRY_PAUSE_S = (0.5, 10.0)  # first and longest pause before a refused line is sent again
READ_CHUNK_LINES = 256


def _usage_of(body: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a route's answer (chat/completions or responses)."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
    return int(prompt or 0), int(completion or 0)


class LeaseLostError(Exception):
    """Another runner holds the batch now (this one's lease lapsed): stop working on it."""


class BatchRunner:
    """Runs batches in the background of the app serving them; see the module docstring."""

    def __init__(
        self,
        batches: BatchStore,
        files: FileStore,
        principal_of_key: PrincipalOfKey,
        *,
        concurrency: int,
        poll_s: float = 2.0,
        key_recheck_s: float = 2.0,
        lease_s: float = 30.0,
    ) -> None:
        self._batches = batches
        self._files = files
        self._principal_of_key = principal_of_key
        self._slots = asyncio.Semaphore(concurrency)
        self._poll_s = poll_s
        self._key_recheck_s = key_recheck_s
        self._lease_s = lease_s
        # This runner's name in the batches' leases: several gateways may share a database.
        self.runner_id = f"runner-{secrets.token_hex(8)}"
        self._app: ASGIApp | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def attach(self, app: ASGIApp) -> None:
        """The app whose routes run the lines (the one this runner serves beside)."""
        self._app = app

    def wake(self) -> None:
        """Looks for new or cancelled batches now rather than at the next poll."""
        self._wake.set()

    async def start(self) -> None:
        """Resumes the batches a previous run left, then watches for new ones."""
        self._task = asyncio.create_task(self._watch(), name="batch-runner")

    async def stop(self) -> None:
        """Stops every batch task; their lines in flight end unbilled and rerun later."""
        task, self._task = self._task, None
        held = list(self._workers)
        workers = list(self._workers.values())
        for each in [task, *workers]:
            if each is not None:
                each.cancel()
        for each in [task, *workers]:
            if each is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await each
        self._workers.clear()
        try:  # a clean stop hands the batches back at once, not when the leases lapse
            await anyio.to_thread.run_sync(self._batches.release, held, self.runner_id)
        except Exception:
            logger.exception("cannot release the batches' leases")

    async def _watch(self) -> None:
        while True:
            self._wake.clear()  # before the scan: a wake during it is not lost
            try:
                active = await anyio.to_thread.run_sync(self._batches.active_ids)
            except Exception:
                logger.exception("cannot list the active batches")
                active = []
            for batch_id in active:
                if batch_id not in self._workers and await self._claim(batch_id):
                    worker = asyncio.create_task(self._run_batch(batch_id), name=batch_id)
                    self._workers[batch_id] = worker
                    worker.add_done_callback(functools.partial(self._forget, batch_id))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)

    async def _claim(self, batch_id: str) -> bool:
        try:
            return await anyio.to_thread.run_sync(
                self._batches.claim, batch_id, self.runner_id, self._lease_s
            )
        except Exception:
            logger.exception("cannot claim a batch", extra={"batch_id": batch_id})
            return False

    def _forget(self, batch_id: str, _task: asyncio.Task[None]) -> None:
        self._workers.pop(batch_id, None)

    async def _run_batch(self, batch_id: str) -> None:
        try:
            await self._drive(batch_id)
        except asyncio.CancelledError:
            raise
        except LeaseLostError:
            logger.warning("another runner took the batch over", extra={"batch_id": batch_id})
        except FileStoreUnavailableError as exc:
            # Already logged with its cause by the store; the next poll tries again.
            logger.warning("batch paused: %s", exc.message, extra={"batch_id": batch_id})
            await asyncio.sleep(self._poll_s)
        except Exception:
            # A database or disk failure: the batch stays active, the next poll retries.
            logger.exception("batch run failed", extra={"batch_id": batch_id})
            await asyncio.sleep(self._poll_s)

    async def _status(self, batch_id: str) -> BatchInfo:
        return await anyio.to_thread.run_sync(self._batches.get, None, batch_id)

    async def _drive(self, batch_id: str) -> None:
        info = await self._status(batch_id)
        if info.status in ("in_progress", "validating"):
            outcome = await self._run_lines(info)
            if outcome is not None:
                status, errors = outcome
                await self._finalize(info, status, errors)
                return
            info = await self._status(batch_id)
        if info.status == "cancelling":
            await self._finalize(info, "cancelled", None)
        elif info.status in ("in_progress", "validating", "finalizing"):
            await self._finalize(info, "completed", None)

    async def _run_lines(self, info: BatchInfo) -> tuple[str, list[dict[str, Any]]] | None:
        """Runs every line without a result. Returns (final status, errors) when the batch
        must end early (key revoked, input gone, window passed), else None."""
        try:
            principal = await anyio.to_thread.run_sync(self._principal_of_key, info.key_id)
        except AuthenticationError as exc:
            return "failed", [{"code": f"key_{exc.reason}", "message": str(exc)}]
        try:
            _, source = await anyio.to_thread.run_sync(
                self._files.open_content, info.tenant_id, info.input_file_id
            )
        except ResourceNotFoundError:
            return "failed", [
                {"code": "input_file_missing", "message": "the input file was deleted"}
            ]
        except FileStoreUnavailableError as exc:
            if utcnow() >= info.expires_at:
                return "expired", [{"code": "input_file_unavailable", "message": exc.message}]
            raise
        identity = BatchLineIdentity(principal=principal, batch_id=info.id)
        checked_at = time.monotonic()
        in_flight: set[asyncio.Task[None]] = set()
        lines = read_lines(source)
        try:
            done = await anyio.to_thread.run_sync(self._batches.done_lines, info.id)
            while True:
                chunk = await anyio.to_thread.run_sync(_next_lines, lines, READ_CHUNK_LINES)
                if not chunk:
                    break
                for number, raw in chunk:
                    if number in done:
                        continue
                    await self._slots.acquire()
                    current = await anyio.to_thread.run_sync(self._batches.status_of, info.id)
                    if current != "in_progress":  # cancelled meanwhile
                        self._slots.release()
                        return None
                    if utcnow() >= info.expires_at:
                        self._slots.release()
                        return "expired", []
                    if time.monotonic() - checked_at >= self._key_recheck_s:
                        # A key revoked (or a tenant suspended) mid-batch stops it, within
                        # the recheck interval, like the gateway's own key cache; and the
                        # lease is renewed well before it lapses.
                        checked_at = time.monotonic()
                        if not await self._claim(info.id):
                            self._slots.release()
                            raise LeaseLostError(info.id)
                        try:
                            principal = await anyio.to_thread.run_sync(
                                self._principal_of_key, info.key_id
                            )
                        except AuthenticationError as exc:
                            self._slots.release()
                            return "failed", [{"code": f"key_{exc.reason}", "message": str(exc)}]
                        identity = BatchLineIdentity(principal=principal, batch_id=info.id)
                    task = asyncio.create_task(self._line(info, identity, number, raw))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
        finally:
            lines.close()
            source.close()  # a generator closed before its first line never opened it
            # Lines already sent finish (their results are kept), also when cancelling.
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
        recorded = await anyio.to_thread.run_sync(self._batches.done_lines, info.id)
        if len(recorded) < info.total_lines:
            # A line's result could not be stored (a database error): the batch stays
            # in progress and the next pass runs what is missing.
            raise RuntimeError(f"{info.total_lines - len(recorded)} lines have no result yet")
        return None

    async def _line(
        self, info: BatchInfo, identity: BatchLineIdentity, number: int, raw: bytes
    ) -> None:
        try:
            request_id = line_request_id(info.id, number)
            parsed = parse_line(raw, info.endpoint)
            if isinstance(parsed, LineError):
                record: dict[str, Any] = {
                    "id": request_id,
                    "custom_id": parsed.custom_id,
                    "response": None,
                    "error": {
                        "code": parsed.code,
                        "message": f"line {number + 1}: {parsed.message}",
                    },
                }
                await anyio.to_thread.run_sync(
                    lambda: self._batches.record(
                        info.id, number, custom_id=parsed.custom_id, status_code=400, record=record
                    )
                )
                return
            response = await self._send(info, identity, parsed.body, request_id)
            prompt, completion = _usage_of(response.body)
            record = {
                "id": request_id,
                "custom_id": parsed.custom_id,
                "response": {
                    "status_code": response.status,
                    "request_id": request_id,
                    "body": response.body,
                },
                "error": None,
            }
            await anyio.to_thread.run_sync(
                lambda: self._batches.record(
                    info.id,
                    number,
                    custom_id=parsed.custom_id,
                    status_code=response.status,
                    record=record,
                    prompt_tokens=prompt,
                    completion_tokens=completion,
                )
            )
        finally:
            self._slots.release()

    async def _send(
        self, info: BatchInfo, identity: BatchLineIdentity, body: dict[str, Any], request_id: str
    ) -> LineResponse:
        assert self._app is not None, "attach the app first"
        pause = RETRY_PAUSE_S[0]
        while True:
            response = await call_line(
                self._app, info.endpoint, body, identity=identity, request_id=request_id
            )
            if response.status not in RETRY_STATUSES or utcnow() >= info.expires_at:
                return response
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_S[1])

    async def _finalize(
        self, info: BatchInfo, status: str, errors: list[dict[str, Any]] | None
    ) -> None:
        """Writes the output and error files, then ends the batch as `status`."""
        await anyio.to_thread.run_sync(lambda: self._batches.set_status(info.id, "finalizing"))
        output_id = error_id = None
        stem = info.id.removeprefix("batch_")
        if await anyio.to_thread.run_sync(self._has_results, info.id, True):
            output_id = f"file-{stem}-output"
            await anyio.to_thread.run_sync(self._write, info, output_id, True)
        if await anyio.to_thread.run_sync(self._has_results, info.id, False):
            error_id = f"file-{stem}-errors"
            await anyio.to_thread.run_sync(self._write, info, error_id, False)
        fields: dict[str, Any] = {"output_file_id": output_id, "error_file_id": error_id}
        if errors:
            fields["errors"] = errors
        await anyio.to_thread.run_sync(lambda: self._batches.set_status(info.id, status, **fields))
        logger.info("batch ended", extra={"batch_id": info.id, "status": status})

    def _has_results(self, batch_id: str, succeeded: bool) -> bool:
        return next(self._batches.results(batch_id, succeeded=succeeded), None) is not None

    def _write(self, info: BatchInfo, file_id: str, succeeded: bool) -> None:
        kind = "output" if succeeded else "error"
        self._files.write_generated(
            info.tenant_id,
            file_id,
            filename=f"{info.id}_{kind}.jsonl",
            chunks=_jsonl(self._batches.results(info.id, succeeded=succeeded)),
        )


def _next_lines(lines: Iterator[tuple[int, bytes]], count: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for item in lines:
        out.append(item)
        if len(out) >= count:
            break
    return out


def _jsonl(records: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    for record in records:
        yield json.dumps(record, separators=(",", ":")).encode() + b"\n"
