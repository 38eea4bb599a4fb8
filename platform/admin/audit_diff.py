"""What an update changed, for its audit record: the fields whose value differs.

    {"before": {"rpm": 5}, "after": {"rpm": 10}}

Built from the public schemas, which hold no secret; keys and tokens appear only by
id and prefix.
"""

from __future__ import annotations

from pydantic import BaseModel, JsonValue


def _json(view: BaseModel) -> dict[str, JsonValue]:
    data: dict[str, JsonValue] = view.model_dump(mode="json")
    return data


def changed(before: BaseModel, after: BaseModel) -> dict[str, JsonValue]:
    """`before` and `after` of each field whose value differs (both empty: no change)."""
    old, new = _json(before), _json(after)
    keys = [k for k in new if old.get(k) != new[k]]
    return {"before": {k: old.get(k) for k in keys}, "after": {k: new[k] for k in keys}}
