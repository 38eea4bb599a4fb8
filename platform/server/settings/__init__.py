"""The one settings object and what building it needs (see root.py for the layout)."""

from server.settings.admin import (
    MAX_RETENTION_DAYS,
    AdminRole,
    AdminServiceSettings,
    check_oidc_scopes,
)
from server.settings.engine import EngineSettings
from server.settings.gateway import ENGINE_URL_SCHEMES, GatewaySettings, engine_url_groups
from server.settings.responses import ResponsesSettings
from server.settings.root import Settings
from server.settings.secret_files import (
    PUBLIC_PEPPER,
    private_data_dir,
    read_or_create_secret,
)
from server.settings.served_models import BUNDLED_MODEL_PACKAGE, ModelSpec, parse_model_entries
from server.settings.telemetry import TelemetrySettings

__all__ = [
    "BUNDLED_MODEL_PACKAGE",
    "ENGINE_URL_SCHEMES",
    "MAX_RETENTION_DAYS",
    "PUBLIC_PEPPER",
    "AdminRole",
    "AdminServiceSettings",
    "EngineSettings",
    "GatewaySettings",
    "ModelSpec",
    "ResponsesSettings",
    "Settings",
    "TelemetrySettings",
    "check_oidc_scopes",
    "engine_url_groups",
    "parse_model_entries",
    "private_data_dir",
    "read_or_create_secret",
]
