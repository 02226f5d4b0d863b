"""The shared limiter: counters in Redis, so that every gateway (Ray Serve replicas, Kubernetes pods)
counts against the same limits. Each operation is one Lua script, which Redis runs atomically: two
gateways charging one bucket at the same moment never both take its last token. Time is Redis's
own clock (TIME), so gateways with drifting clocks agree.

Buckets are hashes {level, at}; slots sorted sets of holder -> lease end; counters plain integers.
Every key expires once idle for long enough that its state no longer matters (a full bucket,
an empty slot set), so abandoned tenants and keys leave nothing behind.
"""
from __future__ import annotations

from collections.abc import Sequence

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from loraloom.platform.limits.limiter import (
    SLOT_RETRY_S,
    Acquired,
    BucketLevel,
    Charge,
    LimiterUnavailableError,
    Slot,
)

T = TypeVar("T")
# How long a gateway waits on Redis before it goes on without limits.
REDIS_TIMEOUT_S = 2.0


def _reachable(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Redis unreachable becomes LimiterUnavailableError, which the gateway knows how to outlive."""

    @functools.wraps(method)
    async def call(*args: Any, **kwargs: Any) -> T:
        try:
            return await method(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError, OSError) as error:
            raise LimiterUnavailableError(f"the rate-limit store is unreachable: {error}") from error

    return call

# Shared by the scripts: the clock, and a bucket's level refilled up to now.
_PRELUDE = """
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local window = tonumber(ARGV[1])
local function level_of(key, capacity)
  local state = redis.call('HMGET', key, 'level', 'at')
  if not state[1] then return capacity end
  return math.min(capacity, tonumber(state[1]) + (now - tonumber(state[2])) * capacity / window)
end
local function store(key, level)
  redis.call('HSET', key, 'level', tostring(level), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil(window * 2000))
end
"""

# KEYS: the buckets, then the slots. ARGV: window, lease, slot retry, #buckets, then capacity and
# amount per bucket, then limit and holder per slot.
# Returns {refused index (-1: none) , wait ("" : never), level per bucket...} as strings.
_ACQUIRE = _PRELUDE + """
local lease = tonumber(ARGV[2])
local slot_retry = tonumber(ARGV[3])
local buckets = tonumber(ARGV[4])
local levels = {}
local refused, wait = -1, 0
local function refuse(index, seconds)
  if refused == -1 or (wait ~= nil and (seconds == nil or seconds > wait)) then refused, wait = index, seconds end
end
for i = 1, buckets do
  local capacity, amount = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  levels[i] = level_of(KEYS[i], capacity)
  if amount > capacity then refuse(i - 1, nil)
  elseif levels[i] < amount then refuse(i - 1, (amount - levels[i]) * window / capacity) end
end
local slot_args = 5 + 2 * buckets
for j = buckets + 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[j], '-inf', now)
  local limit = tonumber(ARGV[slot_args + 2 * (j - buckets - 1)])
  if redis.call('ZCARD', KEYS[j]) >= limit then refuse(j - 1, slot_retry) end
end
if refused == -1 then
  for i = 1, buckets do
    levels[i] = levels[i] - tonumber(ARGV[4 + 2 * i])
    store(KEYS[i], levels[i])
  end
  for j = buckets + 1, #KEYS do
    redis.call('ZADD', KEYS[j], now + lease, ARGV[slot_args + 2 * (j - buckets - 1) + 1])
    redis.call('PEXPIRE', KEYS[j], math.ceil(lease * 1000))
  end
end
local answer = {tostring(refused), wait == nil and '' or tostring(wait)}
for i = 1, buckets do answer[#answer + 1] = tostring(levels[i]) end
return answer
"""

# KEYS[1]: the bucket. ARGV: window, capacity, amount.
_REFUND = _PRELUDE + """
local capacity = tonumber(ARGV[2])
store(KEYS[1], math.min(capacity, level_of(KEYS[1], capacity) + tonumber(ARGV[3])))
return 1
"""

# KEYS: the buckets. ARGV: window, capacity per bucket. Returns each level as a string.
_PEEK = _PRELUDE + """
local answer = {}
for i = 1, #KEYS do answer[i] = tostring(level_of(KEYS[i], tonumber(ARGV[1 + i]))) end
return answer
"""

# KEYS[1]: the slot set. Returns how many hold it.
_HOLDERS = """
local time = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(time[1]) + tonumber(time[2]) / 1000000)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS[1]: the counter. ARGV: amount. Adds only to a counter that exists (was seeded).
_ADD_IF_SEEDED = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end
return false
"""


class RedisLimiter:
    def __init__(self, url: str, *, window_s: float, lease_s: float, prefix: str) -> None:
        self.window_s = window_s
        self.lease_s = lease_s
        self.prefix = prefix  # every key this limiter writes starts with it
        self.redis = Redis.from_url(url, decode_responses=True, socket_timeout=REDIS_TIMEOUT_S,
                                    socket_connect_timeout=REDIS_TIMEOUT_S)
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._refund = self.redis.register_script(_REFUND)
        self._peek = self.redis.register_script(_PEEK)
        self._holders = self.redis.register_script(_HOLDERS)
        self._add_if_seeded = self.redis.register_script(_ADD_IF_SEEDED)

    def _levels(self, charges: Sequence[Charge], levels: Sequence[str]) -> list[BucketLevel]:
        answer = []
        for charge, text in zip(charges, levels):
            level = float(text)
            answer.append(BucketLevel(capacity=charge.capacity, remaining=level,
                                      reset_s=(charge.capacity - level) * self.window_s / charge.capacity))
        return answer

    @_reachable
    async def acquire(self, charges: Sequence[Charge], slots: Sequence[Slot]) -> Acquired:
        args: list[object] = [self.window_s, self.lease_s, SLOT_RETRY_S, len(charges)]
        for charge in charges:
            args += [charge.capacity, charge.amount]
        for slot in slots:
            args += [slot.limit, slot.holder]
        keys = [self.prefix + charge.key for charge in charges] + [self.prefix + slot.key for slot in slots]
        refused, wait, *levels = await self._acquire(keys=keys, args=args)
        index = int(refused)
        return Acquired(levels=self._levels(charges, levels), refused=None if index < 0 else index,
                        retry_after_s=float(wait) if wait else (None if index >= 0 else 0.0))

    @_reachable
    async def refund(self, charge: Charge) -> None:
        await self._refund(keys=[self.prefix + charge.key], args=[self.window_s, charge.capacity, charge.amount])

    @_reachable
    async def release(self, slots: Sequence[Slot]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for slot in slots:
                pipe.zrem(self.prefix + slot.key, slot.holder)
            await pipe.execute()

    @_reachable
    async def peek(self, charges: Sequence[Charge]) -> list[BucketLevel]:
        if not charges:
            return []
        levels = await self._peek(keys=[self.prefix + charge.key for charge in charges],
                                  args=[self.window_s, *(charge.capacity for charge in charges)])
        return self._levels(charges, levels)

    @_reachable
    async def holders(self, slot: Slot) -> int:
        return int(await self._holders(keys=[self.prefix + slot.key]))

    @_reachable
    async def counter(self, key: str) -> int | None:
        value = await self.redis.get(self.prefix + key)
        return None if value is None else int(value)

    @_reachable
    async def seed_counter(self, key: str, value: int, ttl_s: float) -> None:
        await self.redis.set(self.prefix + key, value, nx=True, px=max(1, int(ttl_s * 1000)))

    @_reachable
    async def add_to_counter(self, key: str, amount: int) -> None:
        await self._add_if_seeded(keys=[self.prefix + key], args=[amount])

    async def close(self) -> None:
        await self.redis.aclose()
