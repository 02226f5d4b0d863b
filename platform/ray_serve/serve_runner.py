"""Running a Serve config file, as `loraloom ray run` and `loraloom ray deploy` do (cli/ray_command.py
prepares the database and the settings first).

`run` does in this process what Ray's own `serve run` does (start or join a cluster, start Serve with the
file's HTTP options, deploy the file's applications), and differs where `serve run` failed its users: it
reports when the application serves, exits at once with Ray's message when it cannot deploy (instead of
Ray retrying the import forever), and stops within seconds on Ctrl-C or SIGTERM, taking the cluster it
started down with it.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any, TextIO

import ray
from ray import serve
from ray.serve._private import api as serve_api
from ray.serve._private.constants import SERVE_NAMESPACE
from ray.serve.context import _get_global_client
from ray.serve.schema import ApplicationStatus, ServeDeploySchema

STATUS_POLL_S = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Bounds the stop on a cluster this command joined: Serve is told to shut down, and the command returns
# after this long even if a replica is still draining (Ray finishes that on its own).
JOINED_SHUTDOWN_TIMEOUT_S = 6.0


class DeployFailedError(RuntimeError):
    """An application of the config could not be deployed; the message is Ray's."""


def config_schema(config: dict[str, Any]) -> ServeDeploySchema:
    """The config as Ray Serve reads it (pydantic.ValidationError names the bad field)."""
    return ServeDeploySchema.model_validate(config)


def deploy_to_cluster(config: dict[str, Any], address: str) -> None:
    """What `serve deploy` does: hand the config to the running cluster's dashboard, and return."""
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    ServeSubmissionClient(address).deploy_applications(config_schema(config).model_dump(exclude_unset=True))


def run_in_foreground(config: dict[str, Any], *, ray_address: str | None, out: TextIO = sys.stderr) -> None:
    """Serve `config` until SIGINT or SIGTERM. With no `ray_address` a local cluster is started here
    and stopped on the way out (Ctrl-C ends every process of it); with one, the cluster is joined and
    Serve is shut down on it at the end, as `serve run` does."""
    schema = config_schema(config)
    stop = threading.Event()
    previous = {number: signal.signal(number, lambda *_: stop.set()) for number in STOP_SIGNALS}
    try:
        ray.init(address=ray_address or "local", namespace=SERVE_NAMESPACE, log_to_driver=True)
        for number in STOP_SIGNALS:  # again: ray.init put its own SIGTERM handler in place of ours
            signal.signal(number, lambda *_: stop.set())
        if stop.is_set():  # Ctrl-C while the cluster started: deploy nothing
            return
        client = serve_api.serve_start(
            http_options=schema.http_options.model_dump(), proxy_location=schema.proxy_location,
            grpc_options=schema.grpc_options.model_dump(), controller_options=schema.controller_options,
        )
        client.deploy_apps(schema, _blocking=False)
        host, port = schema.http_options.host, schema.http_options.port
        out.write(f"loraloom ray: Ray cluster at {ray.get_runtime_context().gcs_address} (RAY_ADDRESS for `ray status`); "
                  f"deploying {[app.name for app in schema.applications]}; Ctrl-C stops\n")
        _wait_serving(schema, stop, out, f"http://{host}:{port}")
        stop.wait()
        out.write("loraloom ray: stopping\n")
    finally:
        _stop(joined=ray_address is not None)
        for number, handler in previous.items():
            signal.signal(number, handler)


def _wait_serving(schema: ServeDeploySchema, stop: threading.Event, out: TextIO, url: str) -> None:
    names = [app.name for app in schema.applications]
    while not stop.is_set():
        statuses = serve.status().applications
        failed = [(name, statuses[name].message) for name in names
                  if name in statuses and statuses[name].status == ApplicationStatus.DEPLOY_FAILED]
        if failed:
            raise DeployFailedError("; ".join(f"application {name!r} failed to deploy: {message}" for name, message in failed))
        if all(name in statuses and statuses[name].status == ApplicationStatus.RUNNING for name in names):
            out.write(f"loraloom ray: serving at {url}\n")
            out.flush()
            return
        stop.wait(STATUS_POLL_S)


def _stop(*, joined: bool) -> None:
    if not ray.is_initialized():
        return
    if joined:  # the cluster stays: take Serve (and so our applications) off it
        try:
            _get_global_client().shutdown(timeout_s=JOINED_SHUTDOWN_TIMEOUT_S)
        except Exception as error:  # the command is ending either way; say why it was not clean
            print(f"loraloom ray: Serve did not shut down cleanly: {error}", file=sys.stderr)
    # A cluster started here ends with its driver: GCS, raylet and every worker stop.
    started = time.monotonic()
    ray.shutdown()
    print(f"loraloom ray: Ray shut down in {time.monotonic() - started:.1f} s", file=sys.stderr)
