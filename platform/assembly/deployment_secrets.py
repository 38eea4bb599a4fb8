"""The secrets a process must share with every other on its database (tenancy.secret_pins),
as these settings hold them."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from admin.settings import AdminSettings
from server.settings import Settings
from tenancy.secret_pins import DeploymentSecret, PinStatus, check_secret_pins, hmac_fingerprint

# Where each secret comes from in development when no setting gives it: a file of the
# data folder (server.settings.read_or_create_secret).
DEVELOPMENT_FILES = {
    "key_pepper": "key-pepper",
    "admin_session_key": "session-signing.key",
    "admin_audit_signing_key": "audit-signing.key",
}


def deployment_secrets(settings: Settings) -> list[DeploymentSecret]:
    """The key pepper, the console's session key and the audit signing key (by its public
    key), fingerprinted."""
    from admin.audit_chain import load_private_key, public_hex

    pinned = [
        DeploymentSecret(
            "api_keys",
            "CLOISTER_KEY_PEPPER",
            hmac_fingerprint(settings.key_pepper.get_secret_value(), "api_keys"),
            "API keys made under one are refused under the other",
        ),
        DeploymentSecret(
            "console_sessions",
            "CLOISTER_ADMIN_SESSION_KEY",
            hmac_fingerprint(settings.admin_session_key.get_secret_value(), "console_sessions"),
            "console sessions signed by one are refused by the other",
        ),
    ]
    audit_key = AdminSettings.from_settings(settings).audit_signing_key
    if audit_key is not None:
        pinned.append(
            DeploymentSecret(
                "audit_checkpoints",
                "CLOISTER_ADMIN_AUDIT_SIGNING_KEY",
                public_hex(load_private_key(audit_key.get_secret_value())),
                "audit checkpoints signed with one fail verification with the other",
            )
        )
    return pinned


def secrets_hint(settings: Settings) -> str:
    """Where this process's secrets come from, and how to give it the database's."""
    from_files = [
        f"{settings.data_dir / file}"
        for field, file in DEVELOPMENT_FILES.items()
        if field not in settings.model_fields_set
    ]
    if not from_files:
        return "set the same values on every process"
    return (
        f"this process read {', '.join(from_files)} (made per data folder in development); "
        "give it the data folder of the process that set the database up (--data-dir, "
        "CLOISTER_DATA_DIR), or the same CLOISTER_KEY_PEPPER, CLOISTER_ADMIN_SESSION_KEY "
        "and CLOISTER_ADMIN_AUDIT_SIGNING_KEY as the others"
    )


def check_deployment_secrets(
    settings: Settings, sessions: sessionmaker[Session]
) -> list[PinStatus]:
    """Pins this process's secrets on a database that has none, or refuses them
    (`tenancy.secret_pins.SecretMismatchError`) where they differ from its pins."""
    return check_secret_pins(sessions, deployment_secrets(settings), hint=secrets_hint(settings))
