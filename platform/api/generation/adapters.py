"""Which adapter a generation request runs on: the one its `adapter_id` (LoRAX) or else its `model`
names, resolved for the caller's tenant, and which of the two fields named it.

An alias split between versions (a canary rollout) gives each request one version: by its `user`
when it sends one (sticky), else drawn for the request; both fields resolve with the same key, so they
agree. The response's `model` then names the version that served (`name@N`), as OpenAI names the
snapshot behind an alias."""
from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from loraloom.platform.api.errors import APIError
from loraloom.platform.api.schemas.generation import GenerationRequest
from loraloom.platform.metering.usage import UsageMeter
from loraloom.platform.registry.errors import AdapterNotFoundError, InvalidAdapterError
from loraloom.platform.registry.lookup import AdapterLookup
from loraloom.platform.registry.named import NamedAdapter
from loraloom.platform.registry.splits import routing_key


@dataclass(frozen=True)
class ResolvedAdapter:
    """The adapter a request runs on (None: the base model) and the request field that named it, which
    every error about the adapter names: `adapter_id` when the request sets it, else `model`."""

    named: NamedAdapter | None
    field: str
    # The response's `model`: the request's, except that an alias (`name:prod`, or a bare registry name,
    # which follows `latest`) in `model` is answered with the version that served it (`name@N`).
    response_model: str


async def resolve_adapter(
    lookup: AdapterLookup, body: GenerationRequest, tenant_id: uuid.UUID, meter: UsageMeter
) -> ResolvedAdapter:
    name, field = (body.model, "model") if body.adapter_id is None else (body.adapter_id, "adapter_id")
    meter.adapter_reference = name  # before resolving: a reference that fails to resolve is logged too
    key = routing_key(body.user)
    adapter = await _resolve(lookup, name, field, tenant_id, key)
    model = adapter
    if field == "adapter_id":
        model = await _resolve(lookup, body.model, "model", tenant_id, key)
        check_model_agrees(body, adapter, model)
    return ResolvedAdapter(adapter, field, response_model=served_model_name(body.model, model))


def served_model_name(requested: str, model: NamedAdapter | None) -> str:
    """`name@N` when `model` followed an alias to a registry version; else the request's `model` as sent."""
    if model is not None and model.alias is not None and model.version is not None:
        return model.handle.name
    return requested


async def _resolve(
    lookup: AdapterLookup, name: str, field: str, tenant_id: uuid.UUID, key: str
) -> NamedAdapter | None:
    try:
        # A lookup may hash files or query a database: keep it off the event loop.
        return await run_in_threadpool(functools.partial(lookup.resolve_named, name, tenant_id, routing_key=key))
    except AdapterNotFoundError as error:
        raise APIError(404, str(error), param=field, code="model_not_found") from None
    except InvalidAdapterError as error:
        raise APIError(400, str(error), param=field) from None


def check_model_agrees(body: GenerationRequest, adapter: NamedAdapter | None, model: NamedAdapter | None) -> None:
    """With `adapter_id` set, `model` may name the base or the same adapter: the response's `model`
    echoes the request's, so a different adapter there would say that something ran which did not.
    Same adapter means the same version of the same name: two names for equal bytes are still two."""
    if model is not None and (adapter is None or model.handle != adapter.handle):
        raise APIError(
            400,
            f"model {body.model!r} and adapter_id {body.adapter_id!r} name different adapters; set model to the "
            "base model (or to the same adapter) when adapter_id names the adapter, or leave adapter_id out",
            param="adapter_id",
        )
