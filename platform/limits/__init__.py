"""Rate limits and quotas: what an operator allows each tenant and API key (`policy.py`, in the
database), and the counters that enforce it (`limiter.py`: one interface, kept in memory by
`memory.py` or shared by several gateways in Redis by `redis_limiter.py`; `factory.py` picks)."""
