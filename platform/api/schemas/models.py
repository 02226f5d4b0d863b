"""GET /v1/models."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from loraloom.platform.api.schemas.common import ListObject


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    parent: str | None = Field(description="For an adapter: the base model it applies to.")


class ModelList(ListObject[ModelCard]):
    pass
