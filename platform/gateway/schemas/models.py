"""`/v1/models` response bodies."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelCard(BaseModel):
    """One model the caller's key may use."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    """The list response."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
