"""Prometheus: what a gateway's adapter change listener (db/change_listener.py) has heard, read at
scrape time. Operators see whether a gateway hears the others; tests wait on the count."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from loraloom.platform.db.change_listener import PostgresChangeListener


class ChangeListenerCollector(Collector):
    def __init__(self, listener: PostgresChangeListener) -> None:
        self.listener = listener

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "loraloom_adapter_change_notifications",
            "Adapter change notifications from the database applied to this gateway's resolution cache.",
            value=self.listener.notifications_received,
        )
        yield CounterMetricFamily(
            "loraloom_adapter_change_connections",
            "Times the change listener started listening: its first connection, then each reconnection.",
            value=self.listener.connections,
        )
        yield GaugeMetricFamily(
            "loraloom_adapter_change_listening",
            "1 while the change listener is connected; while 0 the gateway resolves every adapter from the database.",
            value=int(self.listener.listening),
        )
