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
    root: str = Field(description="vLLM's: the served base model's own name for the base (and for `base`, its "
                                  "alias); an adapter's own id for an adapter.")
    generation_defaults: dict[str, float | int] = Field(
        description="What a request to this model gets for the sampling fields it leaves out (temperature, "
        "top_p, top_k, repetition_penalty, max_tokens), from the base model's generation_config.json; fields "
        "not listed get the server's defaults (temperature 1, top_p 1). Empty with `serve --generation-config none`."
    )


class ModelList(ListObject[ModelCard]):
    pass
