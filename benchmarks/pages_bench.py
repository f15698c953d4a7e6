"""Page benchmark on a run of 100,000 scenarios with 3 evaluators (seeded like metrics_bench):
server time of the run page, a page of the scenario table (50 rows sorted by a metric, reached
by an old ``?page=7`` link and by the cursor its Next link carries), a filtered table page, a
drill-in and the progress fragment, each the median of 20 requests through Django's test client
(the whole middleware and template stack, no network), with each page's query count.

    uv run python benchmarks/pages_bench.py [--scenarios 100000] [--requests 20] [--run ID]

``--run`` measures a run seeded by an earlier call (seeding 100,000 scenarios takes minutes).
Targets on a 2-core machine (issue 17): run page <= 40 ms, table page <= 80 ms, drill-in
<= 25 ms, and within 2x of these at 1,000,000 scenarios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import metrics_bench
from django.conf import settings
from django.db import connection, reset_queries
from django.test import Client
from django.test.utils import CaptureQueriesContext

from evalsite.models import Role
from evalsite.services import membership_set, user_get_or_create
from runs import metrics, selectors
from runs.models import Run


def measure(client: Client, url: str, requests: int, **headers) -> tuple[float, int]:
    """The median server time of ``url`` in ms, and how many queries one request makes."""
    client.get(url, **headers)  # the first visit of a project writes the session
    reset_queries()  # a request resets the log: count from an empty one
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url, **headers).status_code == 200, url
    count = len(queries)  # read now: the next request empties the log it slices
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url, **headers)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(times), count


def seeded(scenarios: int) -> Run:
    run, _ = metrics_bench.seed(scenarios)
    # What the engine does after the cells: per-scenario statistics and the read model the
    # table sorts on, then run-wide; then what autovacuum does to the new rows.
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE runs_scenariovalue")
        cursor.execute("VACUUM ANALYZE runs_runmetrics")
    run.refresh_from_db()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--run", type=int, help="Measure this already seeded run.")
    args = parser.parse_args()
    # Pages render without collectstatic's manifest (a fresh checkout has none).
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }

    run = Run.objects.get(pk=args.run) if args.run else seeded(args.scenarios)
    user = user_get_or_create(username="bench-viewer")
    membership_set(project=run.project, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)
    base = f"/p/{run.project.slug}/runs/{run.pk}/"
    score = next(
        m["column"]["name"] for m in run.mappings if m["column"]["name"].endswith(".score")
    )
    # The cursor page 6's Next link carries: the same 50 rows as ?page=7, read by keyset.
    query = selectors.TableQuery(sort=score, desc=True)
    cursor = selectors.table_page(run, query, offset=250).next.encode()
    table = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    middle = run.scenario_count // 2 + 4321
    results = {
        "run page": measure(client, base, args.requests),
        f"table page 7 (50 rows by {score}, descending), ?page=7": measure(
            client, f"{base}?sort=-{score}&page=7", args.requests, **table
        ),
        "the same page by its cursor (?cursor=)": measure(
            client, f"{base}?sort=-{score}&cursor={cursor}", args.requests, **table
        ),
        "table page 3, judged false only (an exact count of 30%)": measure(
            client, f"{base}?failed=1&page=3", args.requests, **table
        ),
        "drill-in": measure(client, f"{base}scenarios/{middle}/", args.requests),
        "progress fragment": measure(
            client, f"{base}progress", args.requests, HTTP_HX_REQUEST="true"
        ),
    }
    print(
        f"run {run.pk} with {run.scenario_count:,} scenarios x "
        f"{run.steps.filter(type='annotation').count()} evaluators; median of {args.requests}:"
    )
    for name, (ms, queries) in results.items():
        print(f"  {name:<62} {ms:8.1f} ms  {queries:3d} queries")


if __name__ == "__main__":
    main()
