"""Secrets kept in files of the data directory: made once, private, shared by every
process that uses the same directory."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from pydantic import SecretStr

# The pepper every development server used before secrets were generated per data
# directory. It is public, so it is refused everywhere.
PUBLIC_PEPPER = "cloister-development-pepper-change-me"
SECRET_FILE_MODE = 0o600
DATA_DIR_MODE = 0o700


def private_data_dir(path: Path) -> Path:
    """Creates the data directory (mode 0700) if it does not exist yet; returns it."""
    path.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
    return path


def read_or_create_secret(path: Path) -> str:
    """The secret kept in `path`, made once (32 random bytes, hex) with mode 0600.

    The file is written in full under a private temporary name, then linked into place;
    the link fails if `path` exists (the O_EXCL rule), so two processes starting at once
    end up with the same secret and nobody ever reads a half-written one.
    """
    if not path.exists():
        private_data_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_FILE_MODE)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(32))
                f.flush()
                os.fsync(f.fileno())
            # FileExistsError: another process made it first, and everyone uses that one.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ValueError(f"{path} is readable by other users (mode {mode:o}); chmod 600 it")
    value = path.read_text(encoding="ascii").strip()
    if not value:
        raise ValueError(f"{path} is empty; delete it to make a new secret")
    return value


def development_secret(file_name: str) -> Any:
    """A default factory: in development, the secret kept in <data_dir>/`file_name`.

    In production it yields an empty value, which the settings validator refuses.
    """

    def factory(data: dict[str, Any]) -> SecretStr:
        if data.get("environment", "development") != "development":
            return SecretStr("")
        return SecretStr(read_or_create_secret(Path(data.get("data_dir", "./var")) / file_name))

    return factory
