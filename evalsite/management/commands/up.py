"""Run the whole site on this machine: migrations, demo data, web server and Celery workers."""

import ipaddress
import os
import signal
import socket
import subprocess
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from evalsite.celery import QUEUES
from evalsite.demo import DEMO_PASSWORD, DEMO_USER
from evalsite.env import env_bool
from evalsite.supervise import Supervisor


class Command(BaseCommand):
    help = "Migrate, load demo data, then run the web server and the Celery workers until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", default=os.environ.get("PORT", "8000"))
        parser.add_argument("--no-demo", action="store_true", help="Skip the demo data.")
        parser.add_argument(
            "--demo-on-public-address",
            action="store_true",
            default=env_bool("EVALSITE_DEMO_ON_PUBLIC_ADDRESS"),
            help="Create the demo account (a printed password) even when --host is not loopback.",
        )

    def handle(self, *args, host, port, no_demo, demo_on_public_address, **options):
        if not no_demo and not demo_on_public_address and not is_loopback(host):
            raise CommandError(
                f"Refusing to create the demo account ({DEMO_USER} / {DEMO_PASSWORD}) on a site "
                f"bound to {host}, where anyone who can reach it could sign in. Use --no-demo and "
                f"create your own account with createsuperuser, or pass "
                f"--demo-on-public-address (EVALSITE_DEMO_ON_PUBLIC_ADDRESS=1) if you mean it."
            )
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("collectstatic", interactive=False, verbosity=0)
        if not no_demo:
            call_command("demo_data")
        env = {**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL", "")}
        children = [
            # Application calls, cheap evaluators, sandboxed code, online rules, and the one beat
            # (its sweeper re-queues units whose worker died).
            (
                "the runs worker",
                lambda: _worker(
                    env,
                    queues=[q for q in QUEUES if q != "llm"],
                    concurrency=os.environ.get("WORKER_CONCURRENCY", "2"),
                    extra=[
                        *("-n", "runs@%h", "--beat"),
                        *("--schedule", str(settings.DATA_DIR / "celerybeat-schedule")),
                    ],
                ),
            ),
            # Model calls wait on the network: many at once in threads, not processes.
            (
                "the llm worker",
                lambda: _worker(
                    env,
                    queues=["llm"],
                    concurrency=os.environ.get("LLM_WORKER_CONCURRENCY", "8"),
                    extra=["-n", "llm@%h", "--pool", "threads"],
                ),
            ),
            ("the web server", lambda: _web(env, host, port)),
        ]
        url = f"http://{host}:{port}/"
        login = "" if no_demo else f"  (log in as {DEMO_USER} / {DEMO_PASSWORD})"
        self.stdout.write(
            self.style.SUCCESS(
                f"\nevalsite is up at {url}{login}\n"
                f"Database: {settings.DATABASES['default']['HOST'] or 'localhost'}  Broker: {url_without_credentials(settings.CELERY_BROKER_URL)}\n"
                "Press Ctrl-C to stop.\n"
            )
        )
        # A child that dies (a worker killed for its memory) is started again; one that keeps
        # dying stops the site with the reason.
        supervisor = Supervisor(children, log=lambda line: self.stderr.write(f"up: {line}"))
        signal.signal(signal.SIGTERM, supervisor.stop)  # a service manager's stop: a clean one
        if supervisor.run():
            sys.exit(1)


def _web(env: dict, host: str, port: str) -> subprocess.Popen:
    # Processes, threads and the worker class: gunicorn.conf.py (WEB_CONCURRENCY, WEB_THREADS).
    config = settings.BASE_DIR / "gunicorn.conf.py"
    command = [sys.executable, "-m", "gunicorn", "evalsite.wsgi", "-c", str(config)]
    command += ["--bind", f"{host}:{port}", "--access-logfile", "-"]
    return subprocess.Popen(command, env=env)


def _worker(env: dict, *, queues: list[str], concurrency: str, extra: list[str]):
    command = [sys.executable, "-m", "celery", "-A", "evalsite", "worker", "-l", "info"]
    command += ["-Q", ",".join(queues), "--concurrency", concurrency, *extra]
    return subprocess.Popen(command, env=env)


def is_loopback(host: str) -> bool:
    """Whether a bind address only this machine reaches (a name is looked up once)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        except OSError:
            return False
        return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def url_without_credentials(url: str) -> str:
    """Scheme, host and port of a URL: never the user or password it may carry."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or 'local socket'}{f':{parts.port}' if parts.port else ''}"
