"""The settings reference (docs/settings.md), written from the settings models
themselves: each setting's variables, default and the comments beside its field.

`python -m server.settings.reference > docs/settings.md` rewrites it; a test keeps it
current.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from server.settings.flat_names import GROUPS, env_names
from server.settings.root import Settings

SECRET_DEFAULT = "(a secret: none in production)"


@dataclass(frozen=True)
class SettingRow:
    """One setting as the reference lists it."""

    place: str  # where code reads it: `engine.block_size`, or `port` at the top
    variables: tuple[str, ...]  # the environment variables that set it, flat name first
    values: str  # what it takes: choices, or a kind and its bounds
    default: str
    note: str  # the comments beside the field, joined


def field_notes(model: type[BaseModel]) -> dict[str, str]:
    """Each field's comments in `model`'s source: the block just above it and the one
    at the end of its line."""
    source = textwrap.dedent(inspect.getsource(model))
    lines = source.splitlines()
    (cls,) = ast.parse(source).body
    assert isinstance(cls, ast.ClassDef)
    notes: dict[str, str] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].strip().startswith("#"):
            above.insert(0, lines[row].strip().lstrip("#").strip())
            row -= 1
        end = lines[(node.end_lineno or node.lineno) - 1]
        trailing = end.split("  # ", 1)[1].strip() if "  # " in end else ""
        notes[node.target.id] = " ".join([*above, trailing]).strip()
    return notes


_KINDS = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))


def _values(model: type[BaseModel], name: str) -> str:
    """What a field takes, from its annotation and bounds."""
    info = model.model_fields[name]
    kinds = [a for a in typing.get_args(info.annotation) if a is not type(None)]
    annotation = kinds[0] if len(kinds) == 1 else info.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Literal:
        return " / ".join(str(choice) for choice in typing.get_args(annotation))
    if typing.get_origin(annotation) is tuple:
        return "a comma-separated list"
    if annotation is SecretStr:
        return "a secret"
    if annotation is Path:
        return "a path"
    kind = _KINDS.get(annotation, str(annotation)) if isinstance(annotation, type) else ""
    bounds = [
        f"{sign} {getattr(m, attr)}"
        for m in info.metadata
        for attr, sign in _BOUNDS
        if getattr(m, attr, None) is not None
    ]
    return ", ".join([kind, *bounds])


def _default(model: type[BaseModel], name: str) -> str:
    info = model.model_fields[name]
    if info.default is PydanticUndefined:
        return SECRET_DEFAULT
    value = info.default
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "(empty)"
    return "(unset)" if value is None else str(value)


def reference_rows() -> list[SettingRow]:
    """Every setting: the shared ones at the top first, then each group's."""
    rows: list[SettingRow] = []
    top_notes = field_notes(Settings)
    for name in Settings.model_fields:
        if name in GROUPS:
            continue
        rows.append(
            SettingRow(
                name,
                env_names((name,))[1],
                _values(Settings, name),
                _default(Settings, name),
                top_notes[name],
            )
        )
    for group, (model, _) in GROUPS.items():
        notes = field_notes(model)
        for name in model.model_fields:
            rows.append(
                SettingRow(
                    f"{group}.{name}",
                    env_names((group, name))[1],
                    _values(model, name),
                    _default(model, name),
                    notes[name],
                )
            )
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """docs/settings.md's text."""
    head = [
        "# Settings",
        "",
        "<!-- Written by `python -m server.settings.reference`; edit the comments in",
        "platform/server/settings/ instead. -->",
        "",
        "Every setting comes from an environment variable with the `CLOISTER_` prefix;",
        "the command line's flags override them. The settings both services share sit at",
        "the top of `Settings`; each part's own are nested in a group (`engine`, `gateway`,",
        "`telemetry`, `responses`, `admin`). A group's setting has two names, either of",
        "which sets it: its flat name, which it always had (`CLOISTER_BLOCK_SIZE`,",
        "`CLOISTER_RESPONSES_TTL_S`), and its nested one, the group and the field joined",
        "by `__` (`CLOISTER_ENGINE__BLOCK_SIZE`, `CLOISTER_RESPONSES__TTL_S`). Both names",
        "given different values are refused, as is an unknown name inside a group",
        "(`CLOISTER_ENGINE__BLOK_SIZE`). `cloister serve` names the variable of any value",
        "it refuses.",
        "",
        "| setting | variables | takes | default | what it does |",
        "|---|---|---|---|---|",
    ]
    body = [
        f"| `{row.place}` | {'<br>'.join(f'`{v}`' for v in row.variables)} | "
        f"{_cell(row.values)} | `{_cell(row.default)}` | {_cell(row.note)} |"
        for row in reference_rows()
    ]
    return "\n".join(head + body) + "\n"


if __name__ == "__main__":
    print(reference_markdown(), end="")
