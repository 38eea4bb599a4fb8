"""Errors of the admin service; the router maps them to HTTP once."""

from __future__ import annotations


class AdminError(Exception):
    """Base class for errors the admin service raises on purpose."""


class Unauthenticated(AdminError):
    """No valid admin credential (HTTP 401)."""


class AdapterValidationError(AdminError, ValueError):
    """An uploaded adapter is malformed or does not fit its base model (HTTP 400)."""
