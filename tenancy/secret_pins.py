"""Every process on one database holds the same deployment secrets, or does not start.

API keys are stored as HMACs under the key pepper, console sessions are signed with the
session key, and audit checkpoints with the audit signing key. Two gateways (or a
gateway and the CLI) that share a database but not these secrets fail in ways that
look like something else: keys made through one are "incorrect" on the other, a
console login works on every other request behind a load balancer, and the audit log
stops verifying. In development each data folder makes its own secrets, so pointing a
second folder at a shared PostgreSQL is enough to get there.

So the first process to use a database pins a fingerprint of each secret in the
`secret_pins` table (never the secret: an HMAC of a fixed label under it, or the audit
key's public key, which is published anyway), and every later one is compared with
it before it serves or changes anything. After a deliberate rotation an operator
pins the new values (`cloister db secrets --repin`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tenancy.errors import TenancyError
from tenancy.models import SecretPin, utcnow

PinState = Literal["matches", "differs", "unpinned"]


def hmac_fingerprint(secret: str, name: str) -> str:
    """A fingerprint of `secret` that does not reveal it: HMAC-SHA256 of a fixed label."""
    label = f"cloister secret pin v1: {name}".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class DeploymentSecret:
    """One secret as this process holds it: its pin's name (what it protects), the
    setting that sets it, its fingerprint, and what goes wrong where two processes hold
    different values."""

    name: str
    setting: str
    fingerprint: str
    breaks: str


@dataclass(frozen=True)
class PinStatus:
    """How this process's secret compares with the database's pin."""

    secret: DeploymentSecret
    state: PinState
    pinned: str | None  # the fingerprint in the database
    pinned_at: dt.datetime | None


class SecretMismatchError(TenancyError):
    """This process holds a secret other than the one its database was set up with."""

    def __init__(self, differing: Sequence[PinStatus], hint: str) -> None:
        pinned_at = min((s.pinned_at for s in differing if s.pinned_at), default=None)
        each = "; ".join(
            f"{s.secret.setting} (pinned {_short(s.pinned)}, here {_short(s.secret.fingerprint)}:"
            f" {s.secret.breaks})"
            for s in differing
        )
        super().__init__(
            f"this process's secrets are not the ones this database was set up with on "
            f"{_when(pinned_at)}: {each}. Every gateway and CLI on one database needs the "
            f"same secrets: {hint}. After a deliberate rotation, `cloister db secrets "
            "--repin --yes` pins the new ones."
        )
        self.differing = tuple(differing)


def _short(fingerprint: str | None) -> str:
    return "-" if fingerprint is None else fingerprint[:12]


def _when(stamp: dt.datetime | None) -> str:
    return "-" if stamp is None else stamp.strftime("%Y-%m-%d %H:%M UTC")


def pin_states(session: Session, secrets: Sequence[DeploymentSecret]) -> list[PinStatus]:
    """Each secret against the database's pin, changing nothing ("unpinned": none yet)."""
    pins = {p.name: p for p in session.scalars(select(SecretPin))}
    states: list[PinStatus] = []
    for secret in secrets:
        pin = pins.get(secret.name)
        if pin is None:
            states.append(PinStatus(secret, "unpinned", None, None))
            continue
        same = hmac.compare_digest(pin.fingerprint, secret.fingerprint)
        states.append(
            PinStatus(secret, "matches" if same else "differs", pin.fingerprint, pin.pinned_at)
        )
    return states


def check_secret_pins(
    sessions: sessionmaker[Session], secrets: Sequence[DeploymentSecret], *, hint: str
) -> list[PinStatus]:
    """Pins what has no pin yet, then raises `SecretMismatchError` (with `hint`: where
    this process's secrets come from) if any secret differs from its pin.

    Two first starts at once with different values: the second insert fails on the
    primary key, the second process reads the first one's pin and is refused.
    """
    with sessions() as session:
        for status in pin_states(session, secrets):
            if status.state != "unpinned":
                continue
            try:
                with session.begin_nested():
                    session.add(
                        SecretPin(name=status.secret.name, fingerprint=status.secret.fingerprint)
                    )
            except IntegrityError:
                pass  # pinned meanwhile by another process: compared below
        session.commit()
        states = pin_states(session, secrets)
    differing = [s for s in states if s.state == "differs"]
    if differing:
        raise SecretMismatchError(differing, hint)
    return states


def repin_secrets(session: Session, secrets: Sequence[DeploymentSecret]) -> list[PinStatus]:
    """Pins this process's secrets in place of the database's (after a rotation); the
    states returned are those before (the caller commits)."""
    before = pin_states(session, secrets)
    for status in before:
        pin = session.get(SecretPin, status.secret.name)
        if pin is None:
            session.add(SecretPin(name=status.secret.name, fingerprint=status.secret.fingerprint))
        elif status.state == "differs":
            pin.fingerprint, pin.pinned_at = status.secret.fingerprint, utcnow()
    return before
