"""Per-project quotas on interactive work: one project cannot hold every web thread or sandbox.

Everything a person starts from a page or an API call that executes tenant-written work (trying
an evaluator, the code playground, example cases at save time, rendering a judge prompt) runs
while a web thread waits for it. Each project gets ``EVALSITE_INTERACTIVE_SLOTS`` such calls at
once, across every host: a slot is a member of a Redis sorted set scored by when it expires, so
a host that dies mid-call frees its slot when the lease runs out. A call that finds no free slot
is refused at once with a 429 and a ``Retry-After`` (it does not queue inside a web thread),
and the other projects' requests never wait behind it.

Runs and online rules are not interactive: they queue on Celery, where fairness between projects
is the engine's business (docs/runs.md).
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings

from evalsite.errors import InvalidInput
from evalsite.redis_client import client, client_for, site_key

# KEYS[1] the project's slots; ARGV: limit, lease (ms), token. Returns 0 when the slot is taken,
# else the ms until the soonest slot frees.
_ACQUIRE = """
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 1000)
  return 0
end
local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(1, tonumber(soonest[2]) - now)
"""


class Busy(InvalidInput):
    """The project already runs as much interactive work as it may; try again shortly."""

    def __init__(self, limit: int, retry_after_s: float):
        self.retry_after = max(1, math.ceil(retry_after_s))
        super().__init__(
            {
                "non_field_errors": [
                    f"This project already runs {limit} interactive evaluation"
                    f"{'s' if limit != 1 else ''} (trying, playground, example cases, prompt "
                    f"previews) at once; try again in {self.retry_after} s. Runs are not "
                    f"limited by this: they queue."
                ]
            },
            status=429,
        )


@contextmanager
def interactive_slot(project_id: int | None, *, seconds: float | None = None) -> Iterator[None]:
    """Hold one of the project's interactive slots for a call that takes at most ``seconds``
    (by default ``EVALSITE_INTERACTIVE_LEASE_SECONDS``, longer than any single evaluation may)."""
    limit = settings.EVALSITE_INTERACTIVE_SLOTS
    if project_id is None or limit <= 0:
        yield
        return
    key = site_key("interactive", project_id)
    token = secrets.token_hex(8)
    seconds = settings.EVALSITE_INTERACTIVE_LEASE_SECONDS if seconds is None else seconds + 10
    lease_ms = int(seconds * 1000)
    wait_ms = int(_acquire()(keys=[key], args=[limit, lease_ms, token]))
    if wait_ms:
        raise Busy(limit, wait_ms / 1000)
    try:
        yield
    finally:
        client().zrem(key, token)


@functools.cache
def _script(url: str):
    return client_for(url).register_script(_ACQUIRE)


def _acquire():
    return _script(settings.REDIS_URL)
