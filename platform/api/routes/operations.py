"""GET /health and GET /metrics (Prometheus text format)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

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


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(request: Request) -> Response:
    # In a worker thread: a remote engine's stats are a call to another process (ray_serve/remote_client.py).
    text = await run_in_threadpool(generate_latest, request.app.state.metrics_registry)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
