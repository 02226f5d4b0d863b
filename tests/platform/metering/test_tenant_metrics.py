"""Per-tenant engine metrics (engine/fair_share.py through EngineStats to Prometheus), read off a real
engine on a tiny checkpoint: one sequence at a time, so one tenant runs while the other queues."""
from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loraloom.engine import SamplingParams, TenantTag
from loraloom.engine.config import EngineConfig
from loraloom.engine.llm_engine import LLMEngine
from loraloom.platform.metering.engine_metrics import engine_metrics_registry

ACME, GLOBEX = TenantTag("id-1", "acme"), TenantTag("id-2", "globex", weight=2.0)


def samples(engine: LLMEngine) -> dict[tuple[str, str], float]:
    text = generate_latest(engine_metrics_registry(engine.stats)).decode()
    return {(sample.name, sample.labels["tenant"]): sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name.startswith("loraloom_tenant_")}


def test_queued_running_served_and_share_per_tenant(tiny_checkpoint):
    engine = LLMEngine(tiny_checkpoint, EngineConfig(num_kv_blocks=64, max_num_seqs=1))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    engine.add_request("a", [5, 6, 7, 8], params, tenant=ACME)
    engine.add_request("g", [9, 10], params, tenant=GLOBEX)
    engine.step()
    seen = samples(engine)
    assert seen[("loraloom_tenant_requests_running", "acme")] == 1
    assert seen[("loraloom_tenant_requests_waiting", "globex")] == 1
    assert seen[("loraloom_tenant_served_tokens_total", "acme")] == 4 + 1  # its prompt and its first token
    assert seen[("loraloom_tenant_share_counter", "acme")] == 5
    while engine.has_unfinished():
        engine.step()
    seen = samples(engine)
    assert seen[("loraloom_tenant_served_tokens_total", "globex")] == 2 + 3
    assert seen[("loraloom_tenant_share_counter", "globex")] >= 5 / 2.0  # served / weight, plus its lift
    assert seen[("loraloom_tenant_requests_running", "globex")] == seen[("loraloom_tenant_requests_waiting", "acme")] == 0
