"""Sandbox settings, read from Django settings when Django is configured, else the environment.

Every setting has the same name in both places (``EVALSITE_SANDBOX_MEMORY_MB`` ...), and a default
that suits a laptop. The package never needs Django: tests and the benchmark run without it.
A malformed value raises ``SandboxError`` naming the setting, so a typo never silently weakens
a limit.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from .errors import SandboxError

RUNNERS = ("sandbox", "inprocess", "celery")
RUNTIMES = ("python", "javascript", "typescript")
PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent.parent


@functools.cache  # once per process
def _default_python() -> str:
    """The host's own interpreter (the real binary behind a virtualenv's symlink), unless an
    unprivileged user could not read it (say, under /root/.pyenv): the jail can only drop to
    uid 65534 with an interpreter that user can run, so a world-readable system Python wins
    then. Its site-packages is never bound either way."""
    own = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    for candidate in (own, "/usr/bin/python3"):
        real = os.path.realpath(candidate)
        if os.path.exists(real) and _world_usable(real):
            return real
    return own


def _world_usable(path: str) -> bool:
    """Every directory on the way is searchable by others, and the file is readable and
    executable by others."""
    import stat

    current = Path(path)
    if current.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH) != (stat.S_IROTH | stat.S_IXOTH):
        return False
    return all(parent.stat().st_mode & stat.S_IXOTH for parent in current.parents)


@dataclass(frozen=True)
class Config:
    """Everything a pool needs to start workers. Frozen and hashable: it is part of a pool key."""

    runner: str = "sandbox"
    bwrap: str = "/usr/bin/bwrap"
    prlimit: str = "/usr/bin/prlimit"
    python: str = field(default_factory=_default_python)
    node: str = "/usr/bin/node"
    node_modules: str = str(REPO_DIR / "node_modules")
    # Host uid of the jail when evalsite runs as root: -1 = 65534, 0 = root's (only with
    # allow_root), any other = that one. A uid that cannot read every bound path refuses to start.
    uid: int = -1
    # Run jailed code as host root when dropping is impossible (or uid=0), instead of refusing.
    allow_root: bool = False
    # Where the harness and node packages are copied when the checkout is out of the jail uid's
    # reach; "" = the data folder, else /var/lib/evalsite/sandbox-runtime, else /tmp (staging.py).
    runtime_dir: str = ""
    memory_mb: int = 256  # Python: address space; Node: data segment + V8 heap
    node_memory_mb: int = 768
    cpu_seconds: int = 120  # per worker lifetime, a backstop behind the wall-clock watchdog
    # Scheduling niceness of jailed code: tenant code that burns CPU yields to web requests.
    nice: int = 10
    file_size_mb: int = 8
    open_files: int = 64
    tmp_mb: int = 16
    log_limit_bytes: int = 64 * 1024
    result_limit_bytes: int = 1024 * 1024
    batch_output_limit_bytes: int = 32 * 1024 * 1024  # results + logs of one batch, in all
    recycle_after: int = 50000  # calls served before a worker is replaced
    workers_per_pool: int = 2
    max_workers: int = 16  # across every pool of this host process
    idle_seconds: float = 300.0
    max_consecutive_faults: int = 3
    start_timeout_s: float = 10.0

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)

    def __hash__(self) -> int:
        # Part of a pool key, looked up on every call: hash the 28 fields once per object.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        # String hashes differ between processes: never carry one over in a pickle.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def load_config() -> Config:
    """The current configuration, resolved once per process: every batch asks for it.

    Django's ``setting_changed`` (``override_settings``, pytest-django's ``settings``) resolves it
    again on the next call; so does ``reset_config``, for code that changes the environment of
    a running process (tests do; a deployment sets it before start-up)."""
    config = _cached.config
    if config is None:
        generation = _cached.generation
        config = _resolve()
        with _cached.lock:
            if _cached.generation == generation:  # no reset while it was being resolved
                _cached.config = config
    return config


def reset_config() -> None:
    """Forget the resolved configuration: the next ``load_config`` reads the settings again."""
    with _cached.lock:
        _cached.generation += 1
        _cached.config = None


class _Cached:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.config: Config | None = None
        self.generation = 0
        self.watching = False


_cached = _Cached()


def _resolve() -> Config:
    values: dict[str, Any] = {}
    for f in fields(Config):
        raw = _lookup(_setting_name(f.name))
        if raw is not None:
            values[f.name] = _cast(f.name, f.type, raw)
    config = Config(**values)
    if config.runner not in RUNNERS:
        raise SandboxError(
            f"EVALSITE_CODE_RUNNER={config.runner!r} must be one of {', '.join(RUNNERS)}."
        )
    return config


def _watch_settings() -> None:
    """Reset the configuration whenever a sandbox setting changes (Django is loaded by now)."""
    if _cached.watching:
        return
    from django.core.signals import setting_changed

    setting_changed.connect(_on_setting_changed, dispatch_uid="evaluators.sandbox.config")
    _cached.watching = True


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("EVALSITE_SANDBOX_") or setting in ("EVALSITE_CODE_RUNNER", "DATA_DIR"):
        reset_config()


def data_dir() -> str:
    """evalsite's data folder (``DATA_DIR`` / ``EVALSITE_DATA_DIR``, default ``<repo>/.data``)."""
    settings = _django_settings()
    if settings is not None and hasattr(settings, "DATA_DIR"):
        return str(settings.DATA_DIR)
    return os.environ.get("EVALSITE_DATA_DIR") or str(REPO_DIR / ".data")


def _setting_name(name: str) -> str:
    return "EVALSITE_CODE_RUNNER" if name == "runner" else f"EVALSITE_SANDBOX_{name.upper()}"


def _lookup(name: str) -> Any:
    settings = _django_settings()
    if settings is not None and hasattr(settings, name):
        return getattr(settings, name)
    return os.environ.get(name)


def _django_settings() -> Any:
    if "django.conf" not in sys.modules:
        return None
    from django.conf import settings

    if not settings.configured:
        return None
    _watch_settings()
    return settings


def _cast(name: str, kind: Any, raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    kind = kind if isinstance(kind, str) else kind.__name__
    if kind == "bool":
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off", ""):
            return False
        raise SandboxError(f"{_setting_name(name)}={raw!r} is not a boolean (1/0, true/false).")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise SandboxError(f"{_setting_name(name)}={raw!r} is not a {kind}.")
    return raw.strip()
