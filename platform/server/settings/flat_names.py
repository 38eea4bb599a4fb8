"""The flat `CLOISTER_*` names every setting had before the settings were nested.

Each group's field `f` is read from CLOISTER_<GROUP>__F (pydantic-settings' nested
delimiter) or from its flat name, CLOISTER_<PREFIX>F, where the prefix is the group's
("responses_", "admin_") or nothing (engine, gateway and telemetry fields kept their
names). The same flat names work as keyword arguments (`Settings(block_size=32)`), which
is how the CLI's flags and the tests give them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from server.settings.admin import AdminServiceSettings
from server.settings.engine import EngineSettings
from server.settings.gateway import GatewaySettings
from server.settings.responses import ResponsesSettings
from server.settings.telemetry import TelemetrySettings

ENV_PREFIX = "CLOISTER_"
NESTED_DELIMITER = "__"

# group name -> (its model, the prefix of its fields' flat names)
GROUPS: Mapping[str, tuple[type[BaseModel], str]] = MappingProxyType(
    {
        "engine": (EngineSettings, ""),
        "gateway": (GatewaySettings, ""),
        "telemetry": (TelemetrySettings, ""),
        "responses": (ResponsesSettings, "responses_"),
        "admin": (AdminServiceSettings, "admin_"),
    }
)

# flat name -> (group, field)
FLAT_NAMES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        f"{prefix}{field}": (group, field)
        for group, (model, prefix) in GROUPS.items()
        for field in model.model_fields
    }
)


def env_names(loc: Iterable[str | int]) -> tuple[str, tuple[str, ...]]:
    """A setting's flat name and its environment variables, from its location in the
    settings (`("engine", "block_size")` -> `block_size`, CLOISTER_BLOCK_SIZE and
    CLOISTER_ENGINE__BLOCK_SIZE); a location that is no one setting gives its dotted
    form and no variable."""
    parts = [str(p) for p in loc]
    if len(parts) >= 2 and parts[0] in GROUPS and parts[1] in GROUPS[parts[0]][0].model_fields:
        group, field = parts[:2]
        flat = f"{GROUPS[group][1]}{field}"
        nested = f"{ENV_PREFIX}{group}{NESTED_DELIMITER}{field}".upper()
        return flat, (f"{ENV_PREFIX}{flat}".upper(), nested)
    if len(parts) == 1 and parts[0] not in GROUPS:
        return parts[0], (f"{ENV_PREFIX}{parts[0]}".upper(),)
    return ".".join(parts), ()


def refused_values(exc: ValidationError) -> list[str]:
    """Each value the settings refused, as a line naming the setting by the name
    operators give it and the variables that set it."""
    lines = []
    for error in exc.errors():
        if error["type"] == "default_factory_not_called":
            continue  # a secret's default waits on the other fields: not an error of its own
        name, variables = env_names(error["loc"])
        where = f" ({' or '.join(variables)})" if variables else ""
        lines.append(f"{name or 'settings'}: {error['msg']}{where}")
    return lines


def _as_dict(value: Any) -> dict[str, Any]:
    """A group's values given as a model or a mapping, as a dict of the given ones."""
    if isinstance(value, BaseModel):
        return {name: getattr(value, name) for name in value.model_fields_set}
    return dict(value) if isinstance(value, Mapping) else {}


def nest_flat_values(data: Any) -> Any:
    """`data` (a settings model's input) with every flat name moved into its group.

    A flat name given here wins over the same field given nested: here flat names come
    only from keyword arguments (the environment's are nested by `FlatEnvSource`), and
    keyword arguments outrank the environment.
    """
    if not isinstance(data, Mapping) or not any(key in FLAT_NAMES for key in data):
        return data
    nested: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key in FLAT_NAMES:
            group, field = FLAT_NAMES[key]
            groups.setdefault(group, {})[field] = value
        else:
            nested[key] = value
    for group, values in groups.items():
        nested[group] = _as_dict(nested.get(group)) | values
    return nested


class FlatEnvSource(PydanticBaseSettingsSource):
    """The nested settings' flat CLOISTER_* environment variables, as nested values.

    Both spellings of one setting with different values are refused: which one wins
    would otherwise be a matter of which line an operator read last.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None):
        super().__init__(settings_cls)
        self._environ = os.environ if environ is None else environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """Unused: `__call__` reads every group at once."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        """{group: {field: raw value}} for each flat variable set."""
        env = {key.upper(): value for key, value in self._environ.items()}
        out: dict[str, dict[str, Any]] = {}
        for group, field in FLAT_NAMES.values():
            _, (name, nested_name) = env_names((group, field))
            if name not in env:
                continue
            if nested_name in env and env[nested_name] != env[name]:
                raise SettingsError(
                    f"{name} and {nested_name} are one setting, given two values: set one of them"
                )
            out.setdefault(group, {})[field] = env[name]
        return out
