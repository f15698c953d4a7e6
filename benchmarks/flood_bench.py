"""Flood benchmark: one project saturates the interactive doors, another project's latency.

    uv run python benchmarks/flood_bench.py [--seconds 30] [--flooders 24] [--requests 40]

Starts the web server the way ``manage.py up`` does (gunicorn, 2 processes x 4 threads, the
sandbox in the web processes) on the configured database and Redis, then:

1. quiet: a member of project B requests B's evaluator page and ``GET /api/v1/evaluators``
   one after the other; the median of each is the quiet value;
2. flood: ``--flooders`` threads of project A post without pause to the doors that execute
   tenant work while a web thread waits: the playground (``evaluators/invoke`` with Python code
   that burns CPU for 3 s), prompt rendering (``llm-judge/render`` with a jinja2 template that
   loops over a long string) and saves with example cases (each case sleeping 1 s); meanwhile B
   repeats its requests for ``--seconds`` and the medians are taken again.

Both phases run three times on the same machine in one go, so the ratios compare: with the
per-project quota off (``EVALSITE_INTERACTIVE_SLOTS=0``, what main had before); with the quota
on (the default, 2) and a flood that ignores the 429s and asks again at once; and with the
quota on and a flood that waits the ``Retry-After`` it is given, as HTTP clients do. The target:
with the quota on, B's median page and API latency under flood stay under 2x quiet.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from evalsite.models import Project, Role  # noqa: E402
from evalsite.services import (  # noqa: E402
    api_key_create,
    membership_set,
    project_create,
    user_get_or_create,
)
from evaluators.services import evaluator_create  # noqa: E402

BURN = (
    "import time\n"
    "def evaluate(inputs, outputs, trace):\n"
    "    end = time.time() + 3\n"
    "    while time.time() < end:\n"
    "        pass\n"
    "    return True\n"
)
SLEEP = "import time\ndef evaluate(inputs, outputs, trace):\n    time.sleep(1)\n    return True\n"
PASSWORD = "bench-password-1"  # noqa: S105 (a throwaway account of the benchmark)
LOOP_TEMPLATE = "{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}ok"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _seed() -> dict:
    """Two projects with a member and an editor key each; B gets an evaluator to look at."""
    call_command("collectstatic", interactive=False, verbosity=0)  # as manage.py up does
    keys = {}
    for slug in ("flood-a", "quiet-b"):
        Project.objects.filter(slug=slug).delete()
        user = user_get_or_create(username=f"bench-{slug}", password=PASSWORD)
        project = project_create(name=slug, slug=slug, owner=user)
        membership_set(project=project, user=user, role=Role.OWNER)
        _, raw = api_key_create(project=project, name="bench", role=Role.EDITOR, created_by=user)
        keys[slug] = raw
        if slug == "quiet-b":
            evaluator_create(project=project, kind="exact_match", name="Exact")
    return keys


def _server(port: int, slots: int) -> subprocess.Popen:
    env = {**os.environ, "EVALSITE_INTERACTIVE_SLOTS": str(slots)}
    command = [sys.executable, "-m", "gunicorn", "evalsite.wsgi", "--bind", f"127.0.0.1:{port}"]
    command += ["--workers", "2", "--threads", "4", "--timeout", "120"]
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 500:
                return process
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("the web server did not start")


def _measure(base: str, key: str, requests: int, seconds: float = 0) -> dict[str, float]:
    """Medians of B's page and API requests: at least ``requests`` of each, and more until
    ``seconds`` have passed (so a flood is sampled over its whole length, not one moment)."""
    headers = {"Authorization": f"Bearer {key}"}
    session = httpx.Client(base_url=base, timeout=300)
    session.get("/login/")  # sets the CSRF cookie the sign-in form needs
    signed_in = session.post(
        "/login/",
        data={
            "username": "bench-quiet-b",
            "password": PASSWORD,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    if signed_in.status_code != 302:
        raise SystemExit(f"sign-in failed: HTTP {signed_in.status_code}")
    times: dict[str, list[float]] = {"page": [], "api": []}
    until = time.monotonic() + seconds
    while len(times["page"]) < requests or time.monotonic() < until:
        for name, call in (
            ("page", lambda: session.get("/p/quiet-b/evaluators/")),
            ("api", lambda: session.get("/api/v1/evaluators", headers=headers)),
        ):
            started = time.perf_counter()
            response = call()
            times[name].append((time.perf_counter() - started) * 1000)
            if response.status_code >= 500:
                raise SystemExit(f"{name}: HTTP {response.status_code}")
    return {name: statistics.median(values) for name, values in times.items()}


def _flood(base: str, key: str, stop: threading.Event, outcomes: Counter, polite: bool) -> None:
    client = httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {key}"})
    number = 0
    while not stop.is_set():
        number += 1
        door = number % 3
        try:
            if door == 0:
                response = client.post(
                    "/api/v1/evaluators/invoke",
                    json={
                        "kind": "code",
                        "parameters": {"runtime": "python", "version": "2", "code": BURN},
                        "inputs": {},
                        "outputs": "x",
                    },
                )
            elif door == 1:
                response = client.post(
                    "/api/v1/llm-judge/render",
                    json={
                        "parameters": {
                            "connection": "none",
                            "template_format": "jinja2",
                            "messages": [{"role": "user", "content": LOOP_TEMPLATE}],
                        },
                        "inputs": {"s": "x" * 5000},
                        "outputs": "x",
                    },
                )
            else:
                response = client.post(
                    "/api/v1/evaluators",
                    json={
                        "name": f"flood {threading.get_ident()} {number}",
                        "kind": "code",
                        "parameters": {"runtime": "python", "version": "2", "code": SLEEP},
                        "examples": [{"inputs": {}, "outputs": "x", "expected": {"success": True}}]
                        * 20,
                    },
                )
            outcomes[f"{['playground', 'render', 'examples'][door]} {response.status_code}"] += 1
        except httpx.HTTPError as exc:
            outcomes[f"{type(exc).__name__}"] += 1
            continue
        if polite and response.status_code == 429:
            stop.wait(float(response.headers.get("Retry-After", "1")))


def _phase(base: str, keys: dict, args, polite: bool) -> dict:
    quiet = _measure(base, keys["quiet-b"], args.requests)
    stop, outcomes = threading.Event(), Counter()
    threads = [
        threading.Thread(target=_flood, args=(base, keys["flood-a"], stop, outcomes, polite))
        for _ in range(args.flooders)
    ]
    for thread in threads:
        thread.start()
    time.sleep(3)  # let the flood take hold
    # Under a flood without the quota one request can take many seconds: sample for the
    # flood's length (at least 5 of each), not a fixed count.
    flooded = _measure(base, keys["quiet-b"], 5, args.seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return {"quiet": quiet, "flooded": flooded, "outcomes": outcomes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--flooders", type=int, default=24)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    keys = _seed()
    results = {}
    phases = (
        ("quota off", 0, False),
        ("quota on", 2, False),
        ("quota on, flood waits Retry-After", 2, True),
    )
    for label, slots, polite in phases:
        port = _free_port()
        server = _server(port, slots)
        try:
            results[label] = _phase(f"http://127.0.0.1:{port}", keys, args, polite)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    print(f"{args.flooders} flooding threads of project A; project B's medians of {args.requests}:")
    for label, result in results.items():
        for name in ("page", "api"):
            quiet, flooded = result["quiet"][name], result["flooded"][name]
            print(
                f"  {label:<34} B {name:<5} quiet {quiet:8.1f} ms   flooded {flooded:9.1f} ms"
                f"   x{flooded / quiet:6.2f}"
            )
        served = ", ".join(f"{k}: {v}" for k, v in sorted(result["outcomes"].items()))
        print(f"  {label:<34} A's flood answers: {served}")


if __name__ == "__main__":
    main()
