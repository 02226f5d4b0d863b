"""GET /v1/models and GET /v1/models/{id}: the base model (as `base` and by its own name) and every
adapter name the caller can send as `model` (registry/catalog.py says which), each with the time its
row was made and the sampling defaults a request to it gets."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from loraloom.engine import EngineClient
from loraloom.platform.api.deps import CallerDep, EngineDep, LookupDep
from loraloom.platform.api.errors import APIError
from loraloom.platform.api.schemas.common import ErrorResponse, unix_seconds
from loraloom.platform.api.schemas.models import ModelCard, ModelList
from loraloom.platform.registry.catalog import ServableName
from loraloom.platform.registry.errors import AdapterNotFoundError

router = APIRouter(tags=["models"])

BASE_NAME = "base"  # what every request may call the base model (registry/references.py ALWAYS_BASE_NAMES)
OWNER = "loraloom"  # owns what every tenant shares: the base model, the server-local adapters


def _card(request: Request, engine: EngineClient, model: ServableName, *, is_base: bool) -> ModelCard:
    """Adapters run with the base's sampling defaults: an adapter directory brings no generation_config.json."""
    created = request.app.state.created if model.created is None else unix_seconds(model.created)
    return ModelCard(id=model.id, created=created, owned_by=model.owner or OWNER,
                     parent=None if is_base else engine.model_name, root=engine.model_name if is_base else model.id,
                     generation_defaults=engine.generation_defaults.chosen())


def _base_cards(request: Request, engine: EngineClient) -> list[ModelCard]:
    """The base under both of the names requests may give it: `base` first, then its own name."""
    return [_card(request, engine, ServableName(id=name), is_base=True) for name in (BASE_NAME, engine.model_name)]


@router.get("/v1/models", response_model=ModelList)
async def list_models(
    request: Request,
    engine: EngineDep,
    lookup: LookupDep,
    caller: CallerDep,
    include_versions: Annotated[
        bool, Query(description="Also list every immutable version as `name@N`.")
    ] = False,
) -> ModelList:
    # In a worker thread: it queries the database and may scan directories and hash files.
    models = await run_in_threadpool(lookup.list_models, caller.tenant_id, include_versions=include_versions)
    return ModelList(data=[*_base_cards(request, engine),
                           *(_card(request, engine, model, is_base=False) for model in models)])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses={404: {"model": ErrorResponse}})
async def retrieve_model(
    model_id: str, request: Request, engine: EngineDep, lookup: LookupDep, caller: CallerDep
) -> ModelCard:
    """Any id the list shows (versions included); another tenant's adapter is as missing as one never made."""
    if model_id in (BASE_NAME, engine.model_name):
        return _card(request, engine, ServableName(id=model_id), is_base=True)
    model = await run_in_threadpool(lookup.find_model, model_id, caller.tenant_id)
    if model is None:
        raise APIError(404, str(AdapterNotFoundError(model_id)), param="model", code="model_not_found")
    return _card(request, engine, model, is_base=False)
