"""Shared limits in Redis: one rate limiter per model connection, and spend counters.

The rate limiter is GCRA (the generic cell rate algorithm) in one Lua script, so every process
that calls a connection (run workers, online rules, the playground, on any host) draws from the
same allowance: ``rate_limit_rpm`` requests per minute with a burst of one second's worth. A 429
that says ``Retry-After`` holds the whole connection back for that long, everywhere.

Spend counters add up the cost of a run's (or a rule's) judge calls; a judge with
``max_cost_usd`` stops calling once the counter reaches it. Calls already in flight still finish,
so the total can pass the cap by at most the cost of the calls in flight (the concurrency).
"""

from __future__ import annotations

import functools
import time

import redis
from django.conf import settings

from evalsite.redis_client import client_for, site_key

# KEYS[1] the limiter; ARGV: emission interval (ms), burst tolerance (ms).
# Returns 0 when the call may go now (and takes its slot), else the ms to wait before asking again.
_ACQUIRE = """
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('HGET', KEYS[1], 'tat') or now)
local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked') or 0)
if blocked > now then
  return blocked - now
end
if tat < now then tat = now end
local allowed_at = tat - tolerance
if allowed_at > now then
  return math.ceil(allowed_at - now)
end
redis.call('HSET', KEYS[1], 'tat', tat + interval)
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(60000, tat + interval - now + 60000)))
return 0
"""

# KEYS[1] the limiter; ARGV[1]: ms during which nobody may call.
_BLOCK = """
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local until_ms = now + tonumber(ARGV[1])
local blocked = tonumber(redis.call('HGET', KEYS[1], 'blocked') or 0)
if until_ms > blocked then
  redis.call('HSET', KEYS[1], 'blocked', until_ms)
  redis.call('PEXPIRE', KEYS[1], math.max(60000, tonumber(ARGV[1]) + 60000))
end
return until_ms
"""

SPEND_TTL_SECONDS = 30 * 24 * 3600


@functools.cache
def client() -> redis.Redis:
    return client_for(settings.REDIS_URL)


@functools.cache
def _scripts(url: str):
    connection = client_for(url)
    return connection.register_script(_ACQUIRE), connection.register_script(_BLOCK)


class RateLimited(Exception):
    """No slot within the wait allowed; ``wait_s`` says how long the next one is away."""

    def __init__(self, wait_s: float):
        super().__init__(f"no request slot within the allowed wait ({wait_s:.1f} s away)")
        self.wait_s = wait_s


class Limiter:
    """The rate limiter of one model connection (a no-op when ``rpm`` is 0)."""

    def __init__(self, connection_id: int, rpm: int) -> None:
        self.key = site_key("llm", "rate", connection_id)
        self.rpm = rpm

    def acquire(self, deadline: float) -> float:
        """Wait for a slot; returns the seconds waited. Raises ``RateLimited`` when the slot
        would come after ``deadline`` (a ``time.monotonic()`` value)."""
        if self.rpm <= 0:
            return 0.0
        acquire, _ = _scripts(settings.REDIS_URL)
        interval = 60000.0 / self.rpm
        tolerance = interval * max(0, self.rpm // 60 - 1)
        started = time.monotonic()
        while True:
            wait_ms = int(acquire(keys=[self.key], args=[interval, tolerance]))
            if wait_ms <= 0:
                return time.monotonic() - started
            wait_s = wait_ms / 1000.0
            if time.monotonic() + wait_s > deadline:
                raise RateLimited(wait_s)
            time.sleep(wait_s)

    def block(self, seconds: float) -> None:
        """Nobody calls this connection for ``seconds`` (a Retry-After), on any worker."""
        if seconds > 0:
            _, block = _scripts(settings.REDIS_URL)
            block(keys=[self.key], args=[int(seconds * 1000)])


class SpendCounter:
    """The accumulated judge cost (USD) of one scope: a run, an online rule, or one batch."""

    def __init__(self, scope: str) -> None:
        self.key = site_key("llm", "spend", scope)

    def total(self) -> float:
        value = client().get(self.key)
        return float(value) if value is not None else 0.0

    def add(self, usd: float) -> float:
        if usd <= 0:
            return self.total()
        pipe = client().pipeline()
        pipe.incrbyfloat(self.key, usd)
        pipe.expire(self.key, SPEND_TTL_SECONDS)
        return float(pipe.execute()[0])
