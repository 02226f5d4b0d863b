"""Per-request latency histograms, kept by the engine where the timestamps are: time to first token,
inter-token latency and end-to-end latency.

Prometheus histograms in all but the library: the engine imports no prometheus_client (it runs on
boxes with torch alone), so it counts observations into fixed buckets here and the platform's
scrape-time collector (platform/metering/engine_metrics.py) turns a snapshot into a histogram
family. The buckets are vLLM's, so dashboards and SLO rules written for vLLM's
`time_to_first_token_seconds`, `inter_token_latency_seconds` and `e2e_request_latency_seconds`
read ours unchanged.

Each request is observed under its (tenant, model) labels (engine/metric_labels.py, which bounds
their number), so an operator reads one adapter's p95 or one tenant's. Written by the step thread,
read by whoever scrapes: a lock keeps a snapshot's count, sum and buckets consistent with each other.
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass

# vLLM's bucket upper bounds, in seconds (vllm/v1/metrics/loggers.py).
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
    80.0, 160.0, 640.0, 2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
E2E_REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
    960.0, 1920.0, 7680.0,
)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram as Prometheus exposes it: cumulative counts per upper bound, the last bound +Inf."""

    buckets: tuple[tuple[float, int], ...]  # (upper bound, observations <= it), ascending, ending at +Inf
    sum: float
    count: int


def merge_histograms(snapshots: list[HistogramSnapshot]) -> HistogramSnapshot | None:
    """Several engines' histograms of the same bounds as one (replicas summed); None from none."""
    if not snapshots:
        return None
    bounds = [bound for bound, _ in snapshots[0].buckets]
    if any([bound for bound, _ in snapshot.buckets] != bounds for snapshot in snapshots):
        raise ValueError("histograms with different bucket bounds cannot be merged")
    counts = [sum(snapshot.buckets[i][1] for snapshot in snapshots) for i in range(len(bounds))]
    return HistogramSnapshot(buckets=tuple(zip(bounds, counts)), sum=sum(s.sum for s in snapshots),
                             count=sum(s.count for s in snapshots))


class LatencyHistogram:
    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        if list(self.bounds) != sorted(set(self.bounds)):
            raise ValueError(f"bounds: must be strictly increasing, got {self.bounds}")
        self._counts = [0] * (len(self.bounds) + 1)  # the last one counts what exceeds every bound
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._add(seconds)

    def observe_all(self, seconds: Iterable[float]) -> None:
        """Many observations under one lock: a step's inter-token gaps, one per running request."""
        with self._lock:
            for value in seconds:
                self._add(value)

    def _add(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus' `le`).
        self._counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self._sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts):
            running += count
            cumulative.append((bound, running))
        return HistogramSnapshot(buckets=tuple(cumulative), sum=total, count=running)


class LatencySeries:
    """One label pair's three histograms."""

    def __init__(self) -> None:
        self.time_to_first_token = LatencyHistogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self.inter_token_latency = LatencyHistogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e_request_latency = LatencyHistogram(E2E_REQUEST_LATENCY_BUCKETS)


# (tenant, model) -> a histogram of that pair (engine/metric_labels.py bounds the pairs).
LabelledHistograms = dict[tuple[str, str], HistogramSnapshot]


@dataclass(frozen=True)
class LatencySnapshots:
    time_to_first_token: LabelledHistograms
    inter_token_latency: LabelledHistograms
    e2e_request_latency: LabelledHistograms


class RequestLatencies:
    """The engine's latency histograms, one set per (tenant, model) label pair; each request feeds its
    pair's as its tokens come and when it ends. A request looks its series up once, at admission."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], LatencySeries] = {}
        self._lock = threading.Lock()  # a scrape lists the pairs while the step thread adds one

    def series(self, labels: tuple[str, str]) -> LatencySeries:
        with self._lock:
            found = self._series.get(labels)
            if found is None:
                found = self._series[labels] = LatencySeries()
            return found

    def snapshot(self) -> LatencySnapshots:
        with self._lock:
            pairs = list(self._series.items())
        return LatencySnapshots(
            time_to_first_token={labels: series.time_to_first_token.snapshot() for labels, series in pairs},
            inter_token_latency={labels: series.inter_token_latency.snapshot() for labels, series in pairs},
            e2e_request_latency={labels: series.e2e_request_latency.snapshot() for labels, series in pairs},
        )


def total_histogram(histograms: LabelledHistograms) -> HistogramSnapshot | None:
    """Every label pair's observations as one histogram (None from none)."""
    return merge_histograms(list(histograms.values()))
