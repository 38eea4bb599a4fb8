"""The store of /v1/responses (`settings.responses`; CLOISTER_RESPONSES__NAME or
CLOISTER_RESPONSES_NAME)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ResponsesSettings(BaseModel):
    """Stored responses (for previous_response_id, GET and DELETE), per tenant, dropped
    after the TTL.

    Each record (conversation and response body, serialized) is at most
    max_record_bytes: a request whose record would be larger is a 400 naming the field
    (store: false skips the bound), and one whose output makes it larger is answered with
    store: false. Each tenant keeps at most max_per_tenant entries and
    max_bytes_per_tenant bytes: past them its own oldest entries go, never another
    tenant's. In memory the store as a whole holds at most max_entries entries and
    max_chars bytes; when the rest is other tenants', a new entry is not stored (store:
    false) rather than evict theirs. "auto": in Redis when redis_url is set (every
    gateway replica on it sees them; no store-wide cap there: tenants x
    max_bytes_per_tenant), else in this process's memory.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Where stored responses live (see above).
    store: Literal["auto", "memory", "redis"] = "auto"
    # The Redis keys' prefix.
    key_prefix: str = "cloister:resp:"
    # How long a stored response is kept.
    ttl_s: float = Field(default=3600.0, gt=0.0, allow_inf_nan=False)
    # Entries in the in-memory store, all tenants.
    max_entries: int = Field(default=10_000, ge=1)
    # Entries one tenant keeps.
    max_per_tenant: int = Field(default=1_000, ge=1)
    max_chars: int = Field(default=200_000_000, ge=1)  # store-wide bytes (memory)
    # One stored record, serialized.
    max_record_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    # The bytes one tenant keeps.
    max_bytes_per_tenant: int = Field(default=32 * 1024 * 1024, ge=1024)

    @model_validator(mode="after")
    def _refuse_caps_that_never_fit(self) -> ResponsesSettings:
        record, tenant = self.max_record_bytes, self.max_bytes_per_tenant
        if record > tenant:
            raise ValueError(
                f"responses_max_record_bytes ({record}) must not exceed "
                f"responses_max_bytes_per_tenant ({tenant})"
            )
        if tenant > self.max_chars:
            raise ValueError(
                f"responses_max_bytes_per_tenant ({tenant}) must not exceed "
                f"responses_max_chars ({self.max_chars}), the store-wide cap"
            )
        return self
