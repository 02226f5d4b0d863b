"""GET /health (open) and GET /metrics (Prometheus text format, the operator's key only).

/metrics names every tenant and adapter with its traffic, so on the API's port it answers only the
operator's admin key as `Authorization: Bearer`. Scrapers that hold no key read the same registry
on `loraloom serve --metrics-port`, a listener of its own bound to loopback by default
(api/metrics_server.py)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from loraloom.platform.api.deps import OperatorDep
from loraloom.platform.api.schemas.common import ErrorResponse

router = APIRouter(tags=["operations"])


@router.get("/health")
async def health(request: Request) -> dict[str, object]:
    """`status` is the API's; `training` (from `loraloom serve`) says whether its worker is up, down or
    restarting, or external (serve --no-worker), and how many times it was restarted."""
    body: dict[str, object] = {"status": "ok"}
    training = request.app.state.training
    if training is not None:
        body["training"] = training.health()
    return body


@router.get(
    "/metrics", response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"model": ErrorResponse}, 403: {"model": ErrorResponse}},
)
async def metrics(request: Request, caller: OperatorDep) -> Response:
    """Every tenant's and adapter's series: the operator's key only (or `serve --metrics-port`, no key)."""
    # In a worker thread: a remote engine's stats are a call to another process (ray_serve/remote_client.py).
    text = await run_in_threadpool(generate_latest, request.app.state.metrics_registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
