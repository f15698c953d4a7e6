"""Export benchmark: the streamed exports of a run, of a comparison and of a testset, at two
sizes, so the rate and the memory can be read against the number of rows. Seeds, per size, a
testset of N rows and two finished runs over it (a judge with a numeric score and a boolean
success, 1 % errored cells, invocation traces with root spans; the read model refreshed as the
engine leaves it), in SQL. Each export is streamed in a fresh process through Django's test
client: time to the first byte, total time, rows per second, and how far the peak RSS rose.

    uv run python benchmarks/export_bench.py [--sizes 10000,100000] [--reuse]

``--reuse`` takes the newest projects an earlier invocation seeded (per size) instead of seeding.
``EVALSITE_ROOT=/path/to/other/checkout`` runs that checkout's code against the same kind of
data (its own migrated database), for a before/after comparison in one session.

Targets on a 2-core machine (issue 17): run export >= 100,000 rows/s, comparison export
>= 50,000 rows/s, the peak RSS growth the same for 100,000 rows as for 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("EVALSITE_ROOT") or str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

import runs_seed  # noqa: E402  (beside this script)
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from evalsite.models import Project  # noqa: E402
from evalsite.services import user_get_or_create  # noqa: E402


def seed(n: int) -> Project:
    stamp = time.strftime("%Y%m%d%H%M%S")
    owner = user_get_or_create(username=f"export-bench-{stamp}", password=secrets.token_urlsafe(16))
    project = runs_seed.runs_seed(
        n,
        slug=f"export-bench-{n}-{stamp}",
        owner=owner,
        run_names=("run 0", "run 1"),
        judges={"Judge": (runs_seed.SCORE_AND_SUCCESS, runs_seed.SCORE_AND_SUCCESS_SCHEMA)},
    )
    runs_seed.read_model_refresh(list(project.runs.order_by("pk")))
    return project


def seeded(n: int, reuse: bool) -> Project:
    if reuse:
        found = Project.objects.filter(slug__startswith=f"export-bench-{n}-").order_by("-pk")
        if found.exists():
            return found.first()
    started = time.perf_counter()
    project = seed(n)
    print(f"seeded {n:,} rows x 2 runs in {time.perf_counter() - started:.0f} s ({project.slug})")
    return project


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def export_stream(url: str, username: str) -> dict:
    """Stream one export in this fresh process: first byte, total, lines, chunks, and how far
    the peak RSS rose above the RSS before the request (after a warm-up request)."""
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    client.get("/healthz")
    before = rss_kb("VmRSS")
    started = time.perf_counter()
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    chunks = iter(response.streaming_content)
    first = next(chunks)
    ttfb = time.perf_counter() - started
    size, count, lines = len(first), 1, first.count(b"\n")
    for chunk in chunks:
        size += len(chunk)
        lines += chunk.count(b"\n")
        count += 1
    response.close()
    return {
        "ttfb_ms": ttfb * 1000,
        "total_s": time.perf_counter() - started,
        "bytes": size,
        "lines": lines,
        "chunks": count,
        "rss_growth_mb": (rss_kb("VmHWM") - before) / 1024,
    }


def exports(project: Project) -> list[tuple[str, str, int]]:
    """(name, url, header lines) of each export measured."""
    a, b = project.runs.order_by("pk")
    base = f"/p/{project.slug}"
    pair = f"runs={a.pk},{b.pk}"
    return [
        ("run CSV", f"{base}/runs/{a.pk}/export?format=csv", 1),
        ("run JSONL", f"{base}/runs/{a.pk}/export?format=jsonl", 0),
        ("run CSV, score <= 0.1", f"{base}/runs/{a.pk}/export?format=csv&column=judge.score&high=0.1", 1),
        ("run CSV, sorted by -score", f"{base}/runs/{a.pk}/export?format=csv&sort=-judge.score", 1),
        ("comparison CSV", f"{base}/runs/compare/export?{pair}&format=csv", 1),
        ("comparison JSONL", f"{base}/runs/compare/export?{pair}&format=jsonl", 0),
        ("comparison CSV, regressions", f"{base}/runs/compare/export?{pair}&format=csv&filter=regressions", 1),
        ("testset CSV", f"{base}/testsets/questions/export?format=csv", 1),
        ("testset JSONL", f"{base}/testsets/questions/export?format=jsonl", 0),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--reuse", action="store_true", help="Reuse the newest seeded projects.")
    parser.add_argument("--only", default="", help="Measure only exports whose name has this.")
    parser.add_argument("--export", nargs=2, metavar=("URL", "USER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:  # the child process that measures one export
        print(json.dumps(export_stream(*args.export)))
        return
    projects = {int(n): seeded(int(n), args.reuse) for n in args.sizes.split(",")}
    print(f"code: {sys.path[0]}; database: {connection.settings_dict['NAME']}")
    print(
        f"{'export':<30} {'size':>8} {'rows':>8} {'first byte':>11} {'total':>8} "
        f"{'rows/s':>9} {'MB':>6} {'chunks':>7} {'peak RSS +':>10}"
    )
    for name, _, _ in exports(next(iter(projects.values()))):
        if args.only not in name:
            continue
        for n, project in projects.items():
            url, header = next((u, h) for x, u, h in exports(project) if x == name)
            owner = project.memberships.get().user.username
            child = subprocess.run(
                [sys.executable, __file__, "--export", url, owner],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(child.stdout.strip().splitlines()[-1])
            rows = r["lines"] - header
            print(
                f"{name:<30} {n:>8,} {rows:>8,} {r['ttfb_ms']:>8.0f} ms {r['total_s']:>6.2f} s "
                f"{rows / r['total_s']:>9,.0f} {r['bytes'] / 1e6:>6.1f} {r['chunks']:>7,} "
                f"{r['rss_growth_mb']:>7.1f} MB"
            )


if __name__ == "__main__":
    main()
