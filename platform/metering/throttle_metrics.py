"""Prometheus: requests the rate limits refused, per tenant and limit, for operators
(`loraloom_tenant_throttled_requests_total{tenant, limit}`). Counted by the gateway as it answers
429; one series per tenant and limit that ever refused, which the number of tenants bounds."""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

THROTTLED_METRIC = "loraloom_tenant_throttled_requests"


class ThrottledRequests(Collector):
    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()  # counted on the event loop, read by scrapes in a worker thread

    def count(self, *, tenant: str, limit: str) -> None:
        with self._lock:
            self._counts[(tenant, limit)] += 1

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            THROTTLED_METRIC, "Requests refused by a rate limit or quota (429), by tenant and limit.",
            labels=["tenant", "limit"],
        )
        with self._lock:
            counts = sorted(self._counts.items())
        for (tenant, limit), value in counts:
            family.add_metric([tenant, limit], value)
        yield family
