"""Several engine replicas' stats read as one engine's: what the router-protocol gauges report of a
set of replicas (platform/ray_serve), and what GET /v1/engine/status shows.

Counts and totals are added (per-label counts per label tuple, latency histograms bucket by bucket
per label pair), adapter lists joined once each, and the block size (a setting every replica of one
deployment shares) kept, not added. Without ray: the metrics read it whatever the engine client.
"""
from __future__ import annotations

import dataclasses

from loraloom.engine import EngineStats, merge_histograms


def sum_stats(stats: list[EngineStats]) -> EngineStats:
    merged = {}
    for field in dataclasses.fields(EngineStats):
        values = [getattr(one, field.name) for one in stats]
        merged[field.name] = _merge_field(field.name, str(field.type), values)
    return EngineStats(**merged)


def _merge_field(name: str, annotation: str, values: list):
    if name == "block_size":
        return max(values, default=0)
    if annotation == "LabelledHistograms":  # (tenant, model) -> HistogramSnapshot
        pairs = dict.fromkeys(labels for value in values for labels in value)
        return {labels: merge_histograms([value[labels] for value in values if labels in value]) for labels in pairs}
    if annotation.startswith("dict"):
        total: dict = {}
        for value in values:
            for labels, count in value.items():
                total[labels] = total.get(labels, 0) + count
        return total
    if annotation.startswith("list"):
        return list(dict.fromkeys(item for value in values for item in value))  # each once, in order
    return sum(values)
