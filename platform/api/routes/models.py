"""GET /v1/models: the base model and every adapter that can be served on it."""
from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from loraloom.platform.api.deps import CallerDep, EngineDep, LookupDep
from loraloom.platform.api.schemas.models import ModelCard, ModelList

router = APIRouter(tags=["models"])

OWNER = "loraloom"


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request, engine: EngineDep, lookup: LookupDep, caller: CallerDep) -> ModelList:
    created = request.app.state.created
    adapters = await run_in_threadpool(lookup.list_adapters, caller.tenant_id)  # may scan directories and hash files
    base = ModelCard(id=engine.model_name, created=created, owned_by=OWNER, parent=None)
    cards = [
        ModelCard(id=adapter.name, created=created, owned_by=OWNER, parent=engine.model_name) for adapter in adapters
    ]
    return ModelList(data=[base, *cards])
