"""Scale benchmark: how the read path grows from 10,000 to 1,000,000 scenarios.

For each size it seeds one testset and two finished runs over it (3 evaluators each: a numeric
score, a boolean success and a categorical label; 1 % of scenarios with every evaluator cell
errored; invocation traces with their root spans), in set-based SQL (generate_series), then lets
the engine's read-model refresh run on them as it would at a run's end:
``runs.metrics.scenarios_refresh(run=run, scenario_ids=None)`` and ``runs.metrics.run_refresh``.

    uv run python benchmarks/scale_bench.py [--sizes 10000,100000,1000000] [--requests 20]
                                            [--repeat 3] [--keep]

Figures per size (through ``django.test.Client``: middleware, views and templates, no network;
milliseconds are the median of ``--requests`` requests unless said):

- run page: ``/p/<slug>/runs/<id>/`` of the baseline run;
- table page: the scenario table fragment (``HX-Target: run-scenarios``), 50 rows sorted by the
  score descending, the middle page as the table's links reach it (``?cursor=``, keyset);
- table page by ?page=: the same page by an old page-number link (an offset: its cost grows
  with the page, so it is shown, not held to the 2x check);
- drill-in: ``/p/<slug>/runs/<id>/scenarios/<index>/`` of a scenario half-way through;
- compare, cold: ``/p/<slug>/runs/compare?runs=A,B``, the first view: the per-process caches in
  ``runs.compare`` (the runs' values) and Django's cache emptied before each of ``--repeat``
  requests;
- compare, warm: the same page with the caches filled;
- run-wide refresh: ``runs.metrics.run_refresh`` of the baseline, median of ``--repeat``;
- schema inference: ``runs.metrics.schema_infer`` of the 3 evaluators (both runs' outputs),
  median of ``--repeat``;
- run CSV export: ``/p/<slug>/runs/<id>/export?format=csv`` streamed through the client and
  consumed, once; rows (lines after the header) per second.

Then a growth table (each figure at a size divided by its figure at the size before; for the
export, rows/s, so flat is 1.0 and lower is worse) and, for the largest size, one check line per
page: "within 2x of <previous size>".

``--keep`` names each size's project ``scale-<size>`` and reuses it when it exists, so a second
invocation skips seeding (a size is seeded in one transaction: it exists whole or not at all).
Without ``--keep`` every invocation seeds new projects. Seeding also VACUUMs and ANALYZEs the
tables it filled (the steady state autovacuum reaches soon after a big run ends), timed apart.
Other processes on a shared machine make the figures noisy: compare sizes within one invocation.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

import runs_seed  # noqa: E402  (beside this script)
from django.conf import settings  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import QueryDict  # noqa: E402
from django.test import Client  # noqa: E402

from evalsite.models import Project  # noqa: E402
from evalsite.services import user_get_or_create  # noqa: E402
from runs import compare, metrics, selectors  # noqa: E402
from runs.models import Run  # noqa: E402

USER = "scale-bench"
RUN_NAMES = ("scale baseline", "scale candidate")
# No outputs schemas (seed 002's case): the first refresh infers them, as in metrics_bench.
JUDGES = {
    "judge score": ("jsonb_build_object('score', {score})", None),
    "judge success": ("jsonb_build_object('success', {score} >= 0.4)", None),
    "judge label": (
        "jsonb_build_object('label', (ARRAY['good', 'bad', 'meh'])[1 + m.index %% 3])",
        None,
    ),
}
PAGES = ("run page", "table page", "drill-in", "compare, cold", "compare, warm")


# --- seeding ------------------------------------------------------------------------------------


def runs_get_or_seed(n: int, *, keep: bool) -> tuple[Run, Run, dict]:
    """The two runs of size ``n`` (reused by project slug with ``keep``) and what it took."""
    owner = user_get_or_create(username=USER)
    slug = f"scale-{n}" if keep else f"scale-{n}-{time.strftime('%Y%m%d%H%M%S')}"
    timings: dict = {}
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        started = time.perf_counter()
        project = runs_seed.runs_seed(n, slug=slug, owner=owner, run_names=RUN_NAMES, judges=JUDGES)
        timings["seed SQL"] = time.perf_counter() - started
    runs = [Run.objects.get(project=project, name=name) for name in RUN_NAMES]
    # A run not refreshed yet is fresh, or an earlier invocation stopped before its refresh.
    timings |= runs_seed.read_model_refresh(runs)
    return runs[0], runs[1], timings


# --- measuring ----------------------------------------------------------------------------------


def compare_caches_clear() -> int:
    """Empty the per-process caches of ``runs.compare`` (whatever they are called: objects named
    like a cache with ``clear()``, functools caches) and Django's cache; how many were found."""
    found = 0
    modules = [m for name, m in sys.modules.items() if name.startswith(compare.__name__)]
    for module in modules:
        for name, obj in vars(module).items():
            if isinstance(obj, type):
                continue
            if callable(getattr(obj, "cache_clear", None)):
                obj.cache_clear()
                found += 1
            elif "cache" in name.lower() and callable(getattr(obj, "clear", None)):
                obj.clear()
                found += 1
    caches["default"].clear()
    return found


def get_ok(client: Client, url: str, **headers):
    response = client.get(url, **headers)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}: {bytes(response.content[:200])!r}")
    if response.streaming:
        for _ in response.streaming_content:
            pass
    return response


def median_ms(fn: Callable[[], object], times: int, before: Callable[[], object] = int) -> float:
    taken = []
    for _ in range(times):
        before()
        started = time.perf_counter()
        fn()
        taken.append((time.perf_counter() - started) * 1000)
    return statistics.median(taken)


def export_rate(client: Client, url: str) -> tuple[float, int, float]:
    """Stream one export to the end: (data rows per second, rows, seconds)."""
    started = time.perf_counter()
    response = client.get(url)
    if response.status_code != 200:
        raise RuntimeError(f"HTTP {response.status_code}")
    chunks = response.streaming_content if response.streaming else [response.content]
    lines = sum(chunk.count(b"\n") for chunk in chunks)
    response.close()
    seconds = time.perf_counter() - started
    return (lines - 1) / seconds, lines - 1, seconds


def measure(n: int, base: Run, cand: Run, requests: int, repeat: int) -> dict[str, float | None]:
    owner = user_get_or_create(username=USER)
    client = Client()
    client.force_login(owner)
    slug = base.project.slug
    run_url = f"/p/{slug}/runs/{base.pk}/"
    score = next(
        m["column"]["name"]
        for m in base.mappings
        if m["column"]["kind"] == "annotation" and m["column"]["name"].endswith(".score")
    )
    middle = max(1, -(-n // 50) // 2)
    # The middle page as its links reach it (by cursor), and as an old ?page= link does.
    query = selectors.TableQuery.from_params(QueryDict(f"sort=-{score}"))
    after = selectors.table_page(base, query, offset=max((middle - 1) * 50 - 1, 0), limit=1).next
    table_url = f"{run_url}?sort=-{score}&cursor={after.encode()}"
    offset_url = f"{run_url}?sort=-{score}&page={middle}"
    table = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    drill_url = f"{run_url}scenarios/{min(n - 1, n // 2 + 321)}/"
    compare_url = f"/p/{slug}/runs/compare?runs={base.pk},{cand.pk}"
    found_caches = compare_caches_clear()
    if not found_caches:
        print("  note: no cache found in runs.compare; the cold figure may be warm")

    def page(url: str, **headers) -> Callable[[], float]:
        def timed() -> float:
            get_ok(client, url, **headers)  # unmeasured first request: templates, plans
            return median_ms(lambda: get_ok(client, url, **headers), requests)

        return timed

    def inference() -> None:
        for step in base.steps.filter(type="annotation"):
            metrics.schema_infer(revision_id=step.revision_id)

    figures: dict[str, Callable[[], float]] = {
        "run page": page(run_url),
        "table page": page(table_url, **table),
        "table page by ?page=": page(offset_url, **table),
        "drill-in": page(drill_url),
        "compare, cold": lambda: median_ms(
            lambda: get_ok(client, compare_url), repeat, before=compare_caches_clear
        ),
        "compare, warm": page(compare_url),
        "run-wide refresh": lambda: median_ms(lambda: metrics.run_refresh(run=base), repeat),
        "schema inference": lambda: median_ms(inference, repeat),
    }
    get_ok(client, f"/p/{slug}/runs/")  # warm-up: connection, session, middleware, imports
    results: dict[str, float | None] = {}
    for name, fn in figures.items():
        try:
            results[name] = fn()
            print(f"  {name:<26} {results[name]:10.1f} ms")
        except Exception as exc:  # a page that fails is a finding: report it, go on
            results[name] = None
            print(f"  {name:<26} ERROR {type(exc).__name__}: {str(exc)[:300]}")
    try:
        rate, rows, seconds = export_rate(client, f"/p/{slug}/runs/{base.pk}/export?format=csv")
        results["run CSV export"] = rate
        flag = "" if rows == n else f"  (expected {n:,} rows)"
        print(
            f"  {'run CSV export':<26} {rate:10,.0f} rows/s ({rows:,} rows in {seconds:.1f} s){flag}"
        )
    except Exception as exc:
        results["run CSV export"] = None
        print(f"  {'run CSV export':<26} ERROR {type(exc).__name__}: {str(exc)[:300]}")
    return results


def growth_print(sizes: list[int], figures: dict[int, dict[str, float | None]]) -> None:
    pairs = list(itertools.pairwise(sizes))
    if not pairs:
        return
    print("\ngrowth (figure at a size / figure at the size before):")
    header = "".join(f"{f'{b:,} / {a:,}':>22}" for a, b in pairs)
    print(f"  {'':<26}{header}")
    for name in figures[sizes[0]]:
        cells = []
        for a, b in pairs:
            before, after = figures[a].get(name), figures[b].get(name)
            cells.append(f"{after / before:21.2f}x" if before and after else f"{'-':>22}")
        print(f"  {name:<26}{''.join(cells)}")
    a, b = pairs[-1]
    print()
    for name in PAGES:
        before, after = figures[a].get(name), figures[b].get(name)
        verdict = "error" if not (before and after) else "yes" if after <= 2 * before else "no"
        print(f"{name} within 2x of {a:,} at {b:,}: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--requests", type=int, default=20, help="requests per page figure")
    parser.add_argument("--repeat", type=int, default=3, help="cold compares and refreshes")
    parser.add_argument("--keep", action="store_true", help="reuse runs seeded by --keep")
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    logging.getLogger("axes").setLevel(logging.WARNING)  # a line per force_login otherwise
    warnings.filterwarnings("ignore", message="No directory at")  # no collected static files
    # Templates use {% static %}: serve them without a collected manifest.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    figures = {}
    for n in sizes:
        base, cand, timings = runs_get_or_seed(n, keep=args.keep)
        print(
            f"\n{n:,} scenarios x 3 evaluators, runs {base.pk} and {cand.pk} ({base.project.slug})"
        )
        if timings:
            print("  seeding: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
        else:
            print("  seeding: reused (--keep)")
        figures[n] = measure(n, base, cand, args.requests, args.repeat)
    growth_print(sizes, figures)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_pretty(pg_database_size(current_database()))")
        print(f"\ndatabase size: {cursor.fetchone()[0]}")


if __name__ == "__main__":
    main()
