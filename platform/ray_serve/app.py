"""The Ray Serve application: the gateway ingress in front of the engine deployment.

`serve run deploy/ray/serve_config.yaml` (or `loraloom ray run`) builds it with `build_app`; the config
file's `deployments` entries set replicas, GPUs and autoscaling per deployment by name
(engine_deployment.ENGINE_DEPLOYMENT, gateway.GATEWAY_DEPLOYMENT).
"""
from __future__ import annotations

from typing import Any

from ray.serve import Application, Deployment

from loraloom.platform.ray_serve.engine_deployment import EngineDeployment
from loraloom.platform.ray_serve.gateway import GatewayDeployment
from loraloom.platform.ray_serve.options import AppOptions


def build_app(args: dict[str, Any], *, engine: Deployment = EngineDeployment,
              gateway: Deployment = GatewayDeployment) -> Application:
    """The application for `args` (see options.AppOptions); `engine` and `gateway` may be the
    deployments with options of their own (`EngineDeployment.options(num_replicas=2)`)."""
    AppOptions.from_args(args)  # a bad argument fails here, named, rather than in every replica
    return gateway.bind(engine.bind(args), args)
