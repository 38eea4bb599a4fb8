"""Keeps each engine's loaded LoRA adapters in step with the registry.

Every `interval_s` (the server's config_refresh_s) `AdapterSync` reads the adapters of
its served model and brings the engine to them: an adapter not retired and not loaded
is loaded from its `source_path` (status registered -> loaded in the registry); a
loaded one that is retired or gone from the registry is unloaded, and while requests
still use it (`AdapterInUseError`) the next period tries again. Over several engine
replicas (engine_hop.replica_set) an adapter is "loaded" only when every live replica has
it, so a replica that restarted or joined gets the registry's adapters within a period
(and a poll); one that some replicas still hold is unloaded there when it is retired. The gateway stops
routing new requests to a retired adapter once its allow-lists are re-read (the
registry lists only adapters not retired), so an in-use adapter drains.

The database is read and written off the event loop. A failure (database, a bad
adapter folder, an engine refusal) is logged once per adapter and cause and retried
next period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from assembly.periodic_sync import PeriodicSync
from engine_hop.adapters import AdapterInfo, AdapterInUseError

if TYPE_CHECKING:
    pass

log = logging.getLogger("cloister.adapters")
MIN_INTERVAL_S = 0.1  # a refresh of 0 (tests) still leaves the loop room to breathe


class AdapterTarget(Protocol):
    """The part of an engine client the sync uses."""

    model_name: str

    async def load_adapter(self, name: str, path: str) -> AdapterInfo:
        """Loads the PEFT folder at `path` as `name`."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Unloads `name` (raises AdapterInUseError while requests use it)."""
        ...

    def adapters(self) -> list[AdapterInfo]:
        """The adapters loaded now."""
        ...


@dataclass(frozen=True)
class WantedAdapter:
    """One registry adapter of the served model."""

    name: str
    source_path: str
    status: str  # registered | loaded | retired


def read_adapters(session: Session, *, model: str) -> list[WantedAdapter]:
    """The registry's adapters of `model`, by name."""
    from admin.models import LoraAdapter

    rows = session.scalars(
        select(LoraAdapter).where(LoraAdapter.base_model == model).order_by(LoraAdapter.name)
    )
    return [WantedAdapter(r.name, r.source_path, r.status) for r in rows]


def mark_loaded(session: Session, names: list[str]) -> None:
    """Moves `names` from registered to loaded (never a retired one back)."""
    from admin.models import LoraAdapter

    for row in session.scalars(
        select(LoraAdapter).where(LoraAdapter.name.in_(names), LoraAdapter.status == "registered")
    ):
        row.status = "loaded"
    session.commit()


class AdapterSync(PeriodicSync):
    """Loads and unloads one engine client's adapters as the registry says, periodically."""

    task_name = "adapter-sync"

    def __init__(
        self, client: AdapterTarget, sessions: Callable[[], Session], *, interval_s: float
    ) -> None:
        self._client = client
        self._sessions = sessions
        super().__init__(max(MIN_INTERVAL_S, interval_s))
        self._failed: dict[str, str] = {}  # adapter -> the last failure logged for it

    def _read(self) -> list[WantedAdapter]:
        with self._sessions() as session:
            return read_adapters(session, model=self._client.model_name)

    def _mark(self, names: list[str]) -> None:
        with self._sessions() as session:
            mark_loaded(session, names)

    async def sync_once(self) -> bool:
        """One pass; True when it loaded or unloaded an adapter. Never raises."""
        try:
            wanted = await asyncio.to_thread(self._read)
        except Exception:  # noqa: BLE001  (any read failure: retry next period)
            log.exception("reading the adapter registry failed; retrying next period")
            return False
        loaded = {a.name for a in self._client.adapters()}
        # A replica set's adapters may be on some replicas only (one restarted, or an
        # unload was refused on one): those count as loaded for the unloading below.
        partly = set(getattr(self._client, "partly_loaded_adapters", list)())
        servable = {w.name: w for w in wanted if w.status != "retired"}
        changed = False
        newly: list[str] = []
        for name, want in servable.items():
            if name in loaded:
                if want.status == "registered":
                    newly.append(name)  # loaded earlier, status not yet written
                continue
            try:
                info = await self._client.load_adapter(name, want.source_path)
            except Exception as exc:  # noqa: BLE001  (a bad folder must not stop the rest)
                self._note_failure(name, "loading", exc)
                continue
            self._failed.pop(name, None)
            changed = True
            newly.append(name)
            log.info("adapter %s loaded (rank %d, digest %s)", name, info.rank, info.digest[:12])
        for name in sorted((loaded | partly) - set(servable)):
            try:
                await self._client.unload_adapter(name)
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, AdapterInUseError):
                    log.debug("adapter %s is retired but in use; unloading later", name)
                else:
                    self._note_failure(name, "unloading", exc)
                continue
            self._failed.pop(name, None)
            changed = True
            log.info("adapter %s unloaded", name)
        if newly:
            try:
                await asyncio.to_thread(self._mark, newly)
            except Exception:  # noqa: BLE001  (written again next period)
                log.exception("recording adapters as loaded failed; retrying next period")
        return changed

    def _note_failure(self, name: str, doing: str, exc: Exception) -> None:
        cause = f"{type(exc).__name__}: {exc}"
        if self._failed.get(name) != cause:  # once per cause, not once per period
            log.error("%s adapter %s failed (%s); retrying each period", doing, name, cause)
        self._failed[name] = cause
