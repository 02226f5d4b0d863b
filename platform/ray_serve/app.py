"""The Ray Serve application: the gateway ingress in front of the engine deployment.

`loraloom ray run --config deploy/ray/serve_config.yaml` (or Ray's own `serve run` on the same file)
builds it with `build_app`, Ray Serve's application builder: one parameter, the config's `args` dict.
The config file's `deployments` entries set replicas, GPUs and autoscaling per deployment by name
(engine_deployment.ENGINE_DEPLOYMENT, gateway.GATEWAY_DEPLOYMENT).
"""
from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment
from ray.serve.config import RequestRouterConfig

from loraloom.platform.ray_serve.affinity_router import AdapterAffinityRouter
from loraloom.platform.ray_serve.engine_deployment import EngineDeployment
from loraloom.platform.ray_serve.gateway import GatewayDeployment
from loraloom.platform.ray_serve.options import AppOptions


def build_app(args: dict[str, Any]) -> Application:
    """Ray Serve's builder (the config's import_path): the application for `args` (options.AppOptions)."""
    return build_application(args)


def build_application(args: dict[str, Any], *, engine: Deployment = EngineDeployment,
                      gateway: Deployment = GatewayDeployment) -> Application:
    """The application for `args`; in-process callers may pass the deployments with options of their
    own (`EngineDeployment.options(num_replicas=2)`)."""
    options = AppOptions.from_args(args)  # a bad argument fails here, named, rather than in every replica
    router = RequestRouterConfig(request_router_class=AdapterAffinityRouter, request_router_kwargs=options.routing)
    return gateway.bind(engine.options(request_router_config=router).bind(args), args)
