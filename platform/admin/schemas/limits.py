"""Limits of a tenant or one of its keys: the update body and the limits in force."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr


class LimitsUpdate(BaseModel):
    """Limit fields to set: absent fields keep their value, null clears one.

    Unknown fields are kept (extra) so the handler refuses them by name (400), as the
    store's checks refuse bad values.
    """

    model_config = ConfigDict(extra="allow")

    rpm: StrictInt | None = None
    tpm: StrictInt | None = None
    max_concurrent: StrictInt | None = None
    token_budget: StrictInt | None = None
    budget_period: StrictStr | None = None
    max_output_tokens: StrictInt | None = None
    max_prompt_tokens: StrictInt | None = None
    allowed_models: list[StrictStr] | None = None
    max_tokens_in_flight: StrictInt | None = None

    def unknown(self) -> list[str]:
        """Fields sent that are no limit."""
        return sorted(self.model_extra or {})

    def changes(self) -> dict[str, int | str | list[str] | None]:
        """The limit fields the caller sent, with their values."""
        return {f: getattr(self, f) for f in sorted(self.model_fields_set) if f in LIMIT_NAMES}


LIMIT_NAMES = frozenset(LimitsUpdate.model_fields)


class LimitsPublic(BaseModel):
    """The limits in force (None: unlimited); `key_scoped` names per-key overrides."""

    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    token_budget: int | None
    budget_period: str
    max_output_tokens: int | None
    max_prompt_tokens: int | None
    allowed_models: list[str] | None
    # Prompt + max output tokens of the requests in flight at once (None: unlimited).
    max_tokens_in_flight: int | None
    key_scoped: list[str]
