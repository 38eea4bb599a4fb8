"""The newest signed audit checkpoint, copied outside the database (the data directory).

Checkpoints live in the database next to the records they sign. Whoever can delete
the tail of the log can delete the newest checkpoints too, which leaves an older,
still valid, chain. This copy, rewritten after each checkpoint a process signs,
keeps the newest head where a database edit does not reach: `verify` then sees
that records or checkpoints the copy covers are gone.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HEAD_FILE_MODE = 0o600


def load_head(path: Path) -> dict[str, Any] | None:
    """The saved checkpoint, or None when there is none; ValueError when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not a checkpoint") from exc
    if not isinstance(data, dict) or not isinstance(data.get("seq"), int):
        raise ValueError(f"{path} is not a checkpoint")
    return data


def save_head(path: Path, checkpoint: Mapping[str, Any]) -> None:
    """Replaces the saved checkpoint by `checkpoint` unless the saved one is newer.

    Written in full to a private temporary file, then renamed over the old copy, so
    a reader never sees half a file.
    """
    try:
        current = load_head(path)
    except ValueError:
        current = None  # unreadable: the new one replaces it
    if current is not None and current["seq"] >= checkpoint["seq"]:
        return
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, HEAD_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(checkpoint), f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
