"""The limiter's contract, for both backends (in memory; Redis at 127.0.0.1:6379, each test under a
key prefix of its own): all-or-nothing acquisition, retry times from the bucket, refunds capped at
capacity, slots freed by name, counters seeded once; refill over the window on a clock the test
moves; and two limiter objects (two gateways) sharing one Redis bucket, atomically."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from loraloom.platform.limits.limiter import SLOT_RETRY_S, Charge, LimiterUnavailableError, Slot
from loraloom.platform.limits.memory import InMemoryLimiter
from loraloom.platform.limits.redis_limiter import RedisLimiter

pytestmark = pytest.mark.anyio
REDIS_URL = "redis://127.0.0.1:6379/0"
WINDOW_S = 60.0
LEASE_S = 600.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def prefix() -> str:
    return f"loraloom-test:{uuid.uuid4().hex}:"


@pytest.fixture
async def redis_cleanup(prefix) -> AsyncIterator[None]:
    yield
    redis = Redis.from_url(REDIS_URL)
    keys = [key async for key in redis.scan_iter(f"{prefix}*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


@pytest.fixture(params=["memory", "redis"])
async def limiter(request, prefix, redis_cleanup):
    if request.param == "memory":
        made = InMemoryLimiter(window_s=WINDOW_S, lease_s=LEASE_S, clock=Clock())
    else:
        made = RedisLimiter(REDIS_URL, window_s=WINDOW_S, lease_s=LEASE_S, prefix=prefix)
    yield made
    await made.close()


async def test_acquire_is_all_or_nothing_and_says_which_refused(limiter):
    small = Charge(key="tokens:a", capacity=10, amount=8)
    large = Charge(key="tokens:b", capacity=100, amount=8)
    assert (await limiter.acquire([small, large], [])).ok
    refused = await limiter.acquire([large, small], [])
    assert refused.refused == 1  # the small bucket has 2 left, the large one 92
    # It waits for the 6 tokens missing at 10 per minute: 36 s (a little less on Redis's running clock).
    assert 35 <= refused.retry_after_s <= 36
    levels = await limiter.peek([large, small])
    assert levels[0].remaining == pytest.approx(92, abs=0.1)  # the refused request charged nothing
    assert levels[1].remaining == pytest.approx(2, abs=0.1)


async def test_a_charge_larger_than_the_bucket_never_fits(limiter):
    result = await limiter.acquire([Charge(key="tokens:a", capacity=10, amount=11)], [])
    assert result.refused == 0 and result.retry_after_s is None


async def test_refunds_are_capped_at_capacity(limiter):
    charge = Charge(key="tokens:a", capacity=10, amount=6)
    assert (await limiter.acquire([charge], [])).ok
    await limiter.refund(Charge(key="tokens:a", capacity=10, amount=4))
    assert (await limiter.peek([charge]))[0].remaining == pytest.approx(8, abs=0.1)
    await limiter.refund(Charge(key="tokens:a", capacity=10, amount=50))
    level = (await limiter.peek([charge]))[0]
    assert level.remaining == 10 and level.reset_s == 0


async def test_slots_are_held_until_released_by_name(limiter):
    first, second = Slot(key="conc:a", limit=1, holder="one"), Slot(key="conc:a", limit=1, holder="two")
    assert (await limiter.acquire([], [first])).ok
    refused = await limiter.acquire([Charge(key="requests:a", capacity=5, amount=1)], [second])
    assert refused.refused == 1 and refused.retry_after_s == SLOT_RETRY_S
    assert (await limiter.peek([Charge(key="requests:a", capacity=5, amount=1)]))[0].remaining == 5
    assert await limiter.holders(first) == 1
    await limiter.release([second])  # not held: nothing changes
    assert await limiter.holders(first) == 1
    await limiter.release([first])
    assert (await limiter.acquire([], [second])).ok


async def test_counters_are_seeded_once_and_count_only_once_seeded(limiter):
    await limiter.add_to_counter("quota:a", 5)
    assert await limiter.counter("quota:a") is None  # its seed, read from the usage table, will include it
    await limiter.seed_counter("quota:a", 100, ttl_s=3600)
    await limiter.seed_counter("quota:a", 7, ttl_s=3600)  # another request seeded it first: kept
    await limiter.add_to_counter("quota:a", 5)
    assert await limiter.counter("quota:a") == 105


async def test_a_bucket_refills_over_the_window():
    clock = Clock()
    limiter = InMemoryLimiter(window_s=WINDOW_S, lease_s=LEASE_S, clock=clock)
    charge = Charge(key="requests:a", capacity=2, amount=1)
    assert (await limiter.acquire([charge], [])).ok
    assert (await limiter.acquire([charge], [])).ok
    refused = await limiter.acquire([charge], [])
    assert refused.retry_after_s == pytest.approx(30)
    clock.now += 29
    assert not (await limiter.acquire([charge], [])).ok
    clock.now += 1
    after = await limiter.acquire([charge], [])
    assert after.ok and after.levels[0].remaining == pytest.approx(0)
    assert after.levels[0].reset_s == pytest.approx(60)  # two requests' worth to refill


async def test_a_slot_a_dead_gateway_never_released_expires_with_its_lease():
    clock = Clock()
    limiter = InMemoryLimiter(window_s=WINDOW_S, lease_s=LEASE_S, clock=clock)
    assert (await limiter.acquire([], [Slot(key="conc:a", limit=1, holder="lost")])).ok
    assert not (await limiter.acquire([], [Slot(key="conc:a", limit=1, holder="next")])).ok
    clock.now += LEASE_S
    assert (await limiter.acquire([], [Slot(key="conc:a", limit=1, holder="next")])).ok


async def test_two_gateways_share_one_redis_bucket_atomically(prefix, redis_cleanup):
    gateways = [RedisLimiter(REDIS_URL, window_s=WINDOW_S, lease_s=LEASE_S, prefix=prefix) for _ in range(2)]
    try:
        charge = Charge(key="requests:tenant-a", capacity=10, amount=1)
        slot_limit = 3
        attempts = [gateways[index % 2].acquire([charge], [Slot(key="conc:tenant-a", limit=slot_limit,
                                                                   holder=f"h{index}")])
                    for index in range(40)]
        results = await asyncio.gather(*attempts)
        admitted = [result for result in results if result.ok]
        # 40 requests at once through two gateways: exactly the 3 slots are taken, each charged once.
        assert len(admitted) == slot_limit
        assert (await gateways[0].peek([charge]))[0].remaining == pytest.approx(10 - slot_limit, abs=0.1)
        assert await gateways[1].holders(Slot(key="conc:tenant-a", limit=slot_limit, holder="")) == slot_limit
        # What one gateway releases the other sees.
        await gateways[0].release([Slot(key="conc:tenant-a", limit=slot_limit, holder=f"h{index}")
                                   for index in range(40)])
        assert await gateways[1].holders(Slot(key="conc:tenant-a", limit=slot_limit, holder="")) == 0
        # And the requests bucket runs dry across both: 7 more fit, the 8th is refused by either.
        for index in range(7):
            assert (await gateways[index % 2].acquire([charge], [])).ok
        assert not (await gateways[0].acquire([charge], [])).ok
        assert not (await gateways[1].acquire([charge], [])).ok
    finally:
        for gateway in gateways:
            await gateway.close()


async def test_an_unreachable_redis_is_reported_as_unavailable(prefix):
    limiter = RedisLimiter("redis://127.0.0.1:1/0", window_s=WINDOW_S, lease_s=LEASE_S, prefix=prefix)
    try:
        with pytest.raises(LimiterUnavailableError, match="unreachable"):
            await limiter.acquire([Charge(key="requests:a", capacity=1, amount=1)], [])
        with pytest.raises(LimiterUnavailableError):
            await limiter.counter("quota:a")
    finally:
        await limiter.close()
