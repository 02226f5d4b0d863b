"""The labels a request's metrics carry, with their number bounded: (tenant, model).

`model` is what the request ran: `base`, or its adapter as AdapterHandle.name (`name@N` for a
registry version, a checkpoint id, or a server-local adapter's name). Every label pair is a
Prometheus series per histogram bucket and per counter, and adapters are made by users, so an
operator caps how many adapters get a series of their own (vLLM caps its LoRA series the same way):
the first `max_adapters` (tenant, adapter) pairs seen keep their name; later ones are counted under
their tenant with model `other`. The base model is never folded, and tenants are made by the
operator, so the pairs stay under (max_adapters + tenants) x 2.

The decision is made once per request, when the engine admits it, and every metric of the request
uses it: its latencies, its finish reason and the requests counter agree on where it was counted.
"""
from __future__ import annotations

import threading

from loraloom.engine.request import BASE_ADAPTER_LABEL

OTHER_ADAPTERS_LABEL = "other"  # the model label of adapters past the cap (EngineConfig.metrics_max_adapters)


class MetricLabels:
    def __init__(self, max_adapters: int) -> None:
        self.max_adapters = max_adapters
        self._named: set[tuple[str, str]] = set()  # the pairs that keep their adapter's name
        self._lock = threading.Lock()  # admissions come from the step thread, tests call from theirs

    def of(self, tenant: str, model: str) -> tuple[str, str]:
        """The (tenant, model) labels of a request by `tenant` for `model` (BASE_ADAPTER_LABEL or an adapter's name)."""
        if model == BASE_ADAPTER_LABEL:
            return tenant, model
        pair = (tenant, model)
        with self._lock:
            if pair in self._named:
                return pair
            if len(self._named) < self.max_adapters:
                self._named.add(pair)
                return pair
        return tenant, OTHER_ADAPTERS_LABEL
