"""The limiter a gateway uses, chosen from its settings: Redis when `rate_limit_redis_url` is set
(several gateways share the counters), else this process's memory."""
from __future__ import annotations

from loraloom.platform.limits.limiter import Limiter
from loraloom.platform.limits.memory import InMemoryLimiter
from loraloom.platform.limits.redis_limiter import RedisLimiter
from loraloom.platform.settings import Settings


def create_limiter(settings: Settings) -> Limiter:
    window_s, lease_s = settings.rate_limit_window_s, settings.rate_limit_concurrency_lease_s
    if settings.rate_limit_redis_url:
        return RedisLimiter(settings.rate_limit_redis_url, window_s=window_s, lease_s=lease_s,
                            prefix=settings.rate_limit_redis_prefix)
    return InMemoryLimiter(window_s=window_s, lease_s=lease_s)
