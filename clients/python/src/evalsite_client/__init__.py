"""evalsite's Python client and CLI (docs/client.md, docs/ci.md)."""

from evalsite_client.client import ApiError, Client, ConfigError
from evalsite_client.logged import LoggedRun

__all__ = ["ApiError", "Client", "ConfigError", "LoggedRun"]
