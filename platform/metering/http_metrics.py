"""Prometheus: what the API answered, for operators. Counted by the gateway as responses go out
(api/response_metrics.py), read at scrape time.

- `loraloom_http_responses_total{method, route, status}`: every response by its route's template
  (`/v1/fine_tuning/jobs/{job_id}`, never the raw path, which any client can vary without end);
  `unmatched` when no route was reached: no route serves the path, or a middleware refused the
  request first (413 for a body over the limit); methods outside HTTP's usual ones count as `other`.
- `loraloom_api_errors_total{type, code}`: OpenAI-shaped errors by their `type` and `code` (the
  code empty when the error has none), error responses and errors sent inside a stream alike.
  Both come from the API's own code, never from the request, so the series stay few.

The engine's finish reasons (metering/engine_metrics.py) say how generations ended; these say what
HTTP clients saw, refusals before the engine included.
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

HTTP_RESPONSES = "loraloom_http_responses"
API_ERRORS = "loraloom_api_errors"
UNMATCHED_ROUTE = "unmatched"
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class HttpResponseCounts(Collector):
    def __init__(self) -> None:
        self._responses: Counter[tuple[str, str, str]] = Counter()
        self._errors: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()  # counted on the event loop, read by scrapes in a worker thread

    def count_response(self, *, method: str, route: str, status: int) -> None:
        method = method if method in KNOWN_METHODS else "other"
        with self._lock:
            self._responses[(method, route, str(status))] += 1

    def count_error(self, *, error_type: str, code: str | None) -> None:
        with self._lock:
            self._errors[(error_type, code or "")] += 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            responses, errors = sorted(self._responses.items()), sorted(self._errors.items())
        family = CounterMetricFamily(HTTP_RESPONSES, "HTTP responses, by method, route template and status code.",
                                     labels=["method", "route", "status"])
        for labels, value in responses:
            family.add_metric(list(labels), value)
        yield family
        family = CounterMetricFamily(API_ERRORS, "Errors answered (as a response or inside a stream), by OpenAI "
                                     "error type and code.", labels=["type", "code"])
        for labels, value in errors:
            family.add_metric(list(labels), value)
        yield family
