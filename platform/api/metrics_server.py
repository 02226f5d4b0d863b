"""`loraloom serve --metrics-port`: the Prometheus metrics on a listener of their own, without a key.

/metrics names every tenant and adapter, so on the API's port it answers the operator's key only.
Scrapers (Prometheus, the Kubernetes endpoint picker) usually hold no key: they read the same
registry here, on a port bound to loopback by default (as vLLM's and Prometheus' exporters) and
opened wider only by --metrics-host, where the network (a NetworkPolicy, a firewall) says who may
reach it. A plain threaded HTTP server: it answers scrapes while the API's event loop is busy.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


@dataclass
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics (any path answers the same) in a daemon thread;
    port 0 takes a free one (MetricsServer.port says which)."""
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread)
