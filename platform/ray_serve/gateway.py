"""The gateway ingress deployment: the whole HTTP API (create_app) over the engine deployment, through
RayEngineClient. Its control plane is what the LORALOOM_* settings name (PostgreSQL, S3-compatible
storage, a Redis or RabbitMQ broker for training workers started elsewhere); the database must be
migrated first (`loraloom ray` does it, or `loraloom db upgrade`)."""
from __future__ import annotations

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from loraloom.platform.api.composition import compose_app
from loraloom.platform.ray_serve.options import AppOptions
from loraloom.platform.ray_serve.remote_client import RayEngineClient
from loraloom.platform.settings import Settings

GATEWAY_DEPLOYMENT = "LoraloomGateway"
# Requests one gateway replica holds at once. Ray Serve's default (5) made the gateway, which only
# forwards and streams, the cap on how many requests the engine could batch: the mixed benchmark ran
# at half of `loraloom serve`. Above what the engine replicas behind it take together.
GATEWAY_MAX_ONGOING_REQUESTS = 1024


@serve.deployment(name=GATEWAY_DEPLOYMENT, max_ongoing_requests=GATEWAY_MAX_ONGOING_REQUESTS)
@serve.ingress()
class GatewayDeployment:
    def __init__(self, engine: DeploymentHandle, args: dict) -> None:
        self._engine = engine
        self._options = AppOptions.from_args(args)

    async def __serve_build_asgi_app__(self) -> FastAPI:
        """Built once the engine deployment answers: the app's facts (model name, limits) are its own."""
        settings = Settings()  # LORALOOM_* from the replica's environment (the config's runtime_env)
        facts = await self._engine.facts.remote()
        return compose_app(settings, RayEngineClient(self._engine, facts, self._options.model_dir()))
