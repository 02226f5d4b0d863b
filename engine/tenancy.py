"""Who asks, as the engine sees it: a request's tenant tag.

The gateway authenticates a caller and hands the engine a TenantTag with every request. The engine
trusts it as given (it never sees keys) and uses its three parts for three different things:

- `id`, the identity: the scope of the prefix cache (a request only ever reuses KV blocks computed for
  the same tenant id, engine/kv_cache.py) and the account the fair share charges (engine/fair_share.py).
- `name`, a label: the tenant as the API and the metrics show it. Never part of an identity, since names
  are for people and may be reused.
- `weight`, the tenant's fair-share weight: its token counter is charged 1/weight per token, so while
  two tenants both wait, weight 2 receives twice the tokens of weight 1. Set by the operator.

A request without a tag (engine tests, benchmarks, one-tenant embedding) belongs to DEFAULT_TENANT.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantTag:
    id: str
    name: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.weight, (int, float)) or not (self.weight > 0 and math.isfinite(self.weight)):
            raise ValueError(f"tenant weight: must be a finite number > 0, got {self.weight!r}")


DEFAULT_TENANT = TenantTag(id="", name="")
