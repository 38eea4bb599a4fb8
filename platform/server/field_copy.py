"""Records built from another object's attributes of the same names.

Rows, stats and reports reach the API as schemas (pydantic models or dataclasses) whose
fields mostly share the source's names; one copy reads them by the target's own field
list, so a column the target does not declare (a hash, a secret) is never carried over.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel

Target = TypeVar("Target")


def field_names(target: type[Any]) -> list[str]:
    """The fields a pydantic model or a dataclass is built from, in declaration order."""
    if issubclass(target, BaseModel):
        return list(target.model_fields)
    return [f.name for f in dataclasses.fields(target) if f.init]


def copy_fields(target: type[Target], source: object, **given: Any) -> Target:
    """A `target` whose fields are `source`'s attributes of the same names, except those
    `given` (computed or renamed ones), which are taken as they are."""
    copied = {name: getattr(source, name) for name in field_names(target) if name not in given}
    return target(**copied, **given)


def attrs_dict(source: object, names: Iterable[str], **given: Any) -> dict[str, Any]:
    """`source`'s attributes `names` by name, in that order; a name also `given` takes the
    given value (a computed or JSON-ready one), and other `given` entries follow."""
    out = {name: given[name] if name in given else getattr(source, name) for name in names}
    return out | {k: v for k, v in given.items() if k not in out}
