"""The Redis every host shares (``REDIS_URL``): rate limits, spend and debounce keys."""

from __future__ import annotations

import functools

import redis
from django.conf import settings
from django.db import connection


@functools.cache
def client_for(url: str) -> redis.Redis:
    # The embedded Redis is named the way kombu spells unix sockets.
    if url.startswith("redis+socket://"):
        url = "unix://" + url.removeprefix("redis+socket://")
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def client() -> redis.Redis:
    return client_for(settings.REDIS_URL)


def site_key(*parts: object) -> str:
    """A key of this site: it carries the database's name, so two sites (or a test run) sharing
    one Redis never read each other's limits, counters or sets."""
    return ":".join(["evalsite", connection.settings_dict["NAME"], *map(str, parts)])


def glob_escape(text: str) -> str:
    """``text`` matched literally in a key pattern (``SCAN MATCH``)."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
