"""Compare and export benchmark: two runs of 100,000 scenarios on one testset (a judge with a
numeric score and a boolean success, 1 % errors, invocation traces with root spans), seeded in
SQL, then refreshed as the engine leaves a finished run (per-scenario statistics and the read
model, run-wide statistics). Times the compare page (cards, paired tests, the first 50 aligned
rows) as the server renders it, on the first view and once the runs' values are cached, its
rows fragment with a filter, the comparison API, and a streamed CSV export of one run (time to
first byte, total, peak RSS growth of this process).

    uv run python benchmarks/compare_bench.py [--scenarios 100000] [--repeat 5]

Targets on a 2-core machine (issue 17): the first view <= 250 ms, later views <= 40 ms; the
export streams (first byte well under a second, memory growth independent of the number of
rows). Measured: see docs/compare.md, "Performance"; every export at two sizes, before and
after: ``benchmarks/export_bench.py`` ("Export performance"). ``--runs A,B`` reuses runs seeded
by an earlier invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

import runs_seed  # noqa: E402  (beside this script)
from django.conf import settings  # noqa: E402
from django.test import Client  # noqa: E402

from evalsite.services import user_get_or_create  # noqa: E402
from runs import compare  # noqa: E402
from runs.models import Run  # noqa: E402


def seed(n: int) -> tuple[Run, Run, str, object]:
    stamp = time.strftime("%Y%m%d%H%M%S")
    owner = user_get_or_create(username=f"bench-{stamp}", password=secrets.token_urlsafe(16))
    project = runs_seed.runs_seed(
        n,
        slug=f"compare-{stamp}",
        owner=owner,
        run_names=("run a", "run b"),
        judges={"Judge": (runs_seed.SCORE_AND_SUCCESS, runs_seed.SCORE_AND_SUCCESS_SCHEMA)},
    )
    runs = list(project.runs.order_by("pk"))
    runs_seed.read_model_refresh(runs)
    return runs[0], runs[1], project.slug, owner


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def get_ok(client: Client, url: str, **headers):
    response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code)
    return response


def export_stream(url: str, username: str) -> dict:
    """Stream one export in this (fresh) process and measure it: time to the first byte and
    to the first batch of rows, total time, and how far the peak RSS rose above the RSS
    before the request."""
    from django.contrib.auth import get_user_model

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    get_ok(client, "/healthz")
    before = rss_kb("VmRSS")
    started = time.perf_counter()
    response = get_ok(client, url)
    chunks = iter(response.streaming_content)
    first = next(chunks)
    ttfb = time.perf_counter() - started
    size, count, lines = len(first), 1, first.count(b"\n")
    first_rows = None
    for chunk in chunks:
        first_rows = first_rows or time.perf_counter() - started
        size += len(chunk)
        lines += chunk.count(b"\n")
        count += 1
    response.close()
    return {
        "ttfb_ms": ttfb * 1000,
        "first_rows_ms": (first_rows or 0) * 1000,
        "total_s": time.perf_counter() - started,
        "bytes": size,
        "lines": lines,
        "chunks": count,
        "rss_before_mb": before / 1024,
        "rss_growth_mb": (rss_kb("VmHWM") - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--runs", default="", help="Reuse two seeded runs: A,B (skips seeding).")
    parser.add_argument("--export", nargs=2, metavar=("URL", "USER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:  # the child process that measures one export
        print(json.dumps(export_stream(*args.export)))
        return
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }

    started = time.perf_counter()
    if args.runs:
        base, cand = (Run.objects.get(pk=int(i)) for i in args.runs.split(","))
        slug = base.project.slug
        owner = base.project.memberships.get().user
    else:
        base, cand, slug, owner = seed(args.scenarios)
        print(
            f"seeded 2 runs x {args.scenarios:,} scenarios ({args.scenarios * 6:,} results) "
            f"in {time.perf_counter() - started:.1f} s (reuse with --runs {base.pk},{cand.pk})"
        )
    client = Client()
    client.force_login(owner)
    ids = f"runs={base.pk},{cand.pk}"
    page_url = f"/p/{slug}/runs/compare?{ids}"
    fragment_url = f"{page_url}&metric=judge.score&filter=regressions"
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "compare-rows"}
    get_ok(client, f"/p/{slug}/runs/compare")  # warm-up: connection, templates, imports
    cold = []
    for _ in range(args.repeat):
        compare.values_cache_clear()
        cold += timed(lambda: get_ok(client, page_url), 1)
    print(
        f"compare page, cold (values read from PostgreSQL): median {statistics.median(cold):.0f} ms "
        f"(runs: {', '.join(f'{t:.0f}' for t in cold)})"
    )

    comparison = compare.comparison_get(project=base.project, run_ids=[str(base.pk), str(cand.pk)])
    values: dict = {}
    parts = {
        "values of both runs, read": lambda: (
            compare.values_cache_clear(),
            values.update(compare.comparison_values(comparison)),
        ),
        "paired tests": lambda: compare.comparison_stats(comparison, values),
        "filter + 50 rows": lambda: compare.aligned_rows(
            comparison,
            values,
            compare.aligned_indexes(comparison, values, metrics=comparison.metrics)[:50],
            metrics=comparison.metrics,
        ),
    }
    for name, fn in parts.items():
        print(f"  {name}: median {statistics.median(timed(fn, args.repeat)):.0f} ms")

    for name, url, headers in (
        ("compare page, warm (values cached per run)", page_url, {}),
        ("rows fragment, regressions on judge.score", fragment_url, htmx),
        ("compare API (statistics + 50 rows)", f"/api/v1/runs/compare?{ids}&project={slug}", {}),
    ):
        times = timed(lambda u=url, h=headers: get_ok(client, u, **h), args.repeat)
        print(
            f"{name}: median {statistics.median(times):.0f} ms "
            f"(runs: {', '.join(f'{t:.0f}' for t in times)})"
        )
    stats = compare.comparison_stats(comparison, values)
    for metric in stats:
        test = metric["tests"][0]
        print(
            f"  {metric['metric']}: {test['test']} ({test['method']}) difference "
            f"{test['difference']:+.4f} CI [{test['ci'][0]:+.4f}, {test['ci'][1]:+.4f}] "
            f"p={test['p_value']:.3g} n={test['n']:,} excluded={test['excluded']} -> {test['verdict']}"
        )

    for name, url in (
        ("CSV export of one run", f"/p/{slug}/runs/{base.pk}/export?format=csv"),
        (
            "CSV export of one run, filtered to a tenth (judge.score <= 0.1)",
            f"/p/{slug}/runs/{base.pk}/export?format=csv&column=judge.score&high=0.1",
        ),
        ("CSV export of the comparison", f"/p/{slug}/runs/compare/export?{ids}&format=csv"),
    ):
        child = subprocess.run(
            [sys.executable, __file__, "--export", url, owner.username],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"{name} (fresh process): first byte {result['ttfb_ms']:.0f} ms, first rows "
            f"{result['first_rows_ms']:.0f} ms, total {result['total_s']:.1f} s, "
            f"{result['lines']:,} lines, {result['bytes'] / 1e6:.1f} MB in {result['chunks']} chunks, "
            f"peak RSS {result['rss_before_mb']:.0f} MB + {result['rss_growth_mb']:.0f} MB"
        )


if __name__ == "__main__":
    main()
