"""Filesystem sources of models and adapters: regular files (or folders of them) under the roots.

A source path comes from an admin request and is later opened by the server
(for shapes at adapter upload, for weights at load time). Opening a FIFO blocks
forever, a device can be endless, and a path outside the configured roots reads
files the service never meant to serve. So a source is checked with stat calls
only (nothing is opened) before it is registered or read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from admin.errors import AdminError

MAX_FOLDER_ENTRIES = 10_000  # an HF folder has tens of files; a huge tree is refused, not walked


class SourcePathError(AdminError, ValueError):
    """A model or adapter source that may not be read (HTTP 400)."""


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def _resolved_roots(roots: Sequence[Path]) -> list[Path]:
    return [Path(os.path.realpath(root)) for root in roots]


def _check_regular(path: Path, shown: str, roots: list[Path]) -> os.stat_result:
    real = Path(os.path.realpath(path))
    if not _under(real, roots):
        raise SourcePathError(f"source {shown!r} is outside the configured model roots")
    try:
        info = os.stat(real)
    except OSError as exc:
        raise SourcePathError(f"source {shown!r} does not exist or cannot be read") from exc
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise SourcePathError(f"source {shown!r} is not a regular file or folder")
    return info


def _check_folder(top: Path, shown: str, roots: list[Path]) -> None:
    # Symlinked folders are followed (a loader would follow them too); one reached twice
    # is a loop, and the entry bound ends a huge tree.
    seen, pending, count = {top}, [top], 0
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError as exc:
            raise SourcePathError(f"source {shown!r} cannot be listed") from exc
        count += len(entries)
        if count > MAX_FOLDER_ENTRIES:
            raise SourcePathError(f"source {shown!r} holds too many files")
        for entry in entries:
            if stat.S_ISDIR(_check_regular(Path(entry.path), shown, roots).st_mode):
                real = Path(os.path.realpath(entry.path))
                if real in seen:
                    raise SourcePathError(f"source {shown!r} has a folder loop")
                seen.add(real)
                pending.append(real)


def check_source(source: str, roots: Sequence[Path]) -> Path:
    """The resolved source path, or SourcePathError: it must be a regular file, or a folder
    holding only regular files and folders, and resolve (symlinks followed) under a root."""
    if not source or "\x00" in source:
        raise SourcePathError("source must be a non-empty path")
    resolved = _resolved_roots(roots)
    if not resolved:
        raise SourcePathError("no model roots are configured; set CLOISTER_MODEL_ROOTS")
    path = Path(source)
    info = _check_regular(path, source, resolved)
    if stat.S_ISDIR(info.st_mode):
        _check_folder(Path(os.path.realpath(path)), source, resolved)
    return Path(os.path.realpath(path))
