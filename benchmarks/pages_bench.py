"""Page benchmark on a run of 100,000 scenarios with 3 evaluators (seeded like metrics_bench):
server time of the run page, a page of the scenario table (50 rows sorted by a metric), a
drill-in and the progress fragment, each the median of 20 requests through Django's test
client (the whole middleware and template stack, no network).

    uv run python benchmarks/pages_bench.py [--scenarios 100000] [--requests 20]

Targets on a 2-core machine: run page, table page and drill-in < 150 ms, progress < 20 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import metrics_bench
from django.test import Client

from evalsite.models import Role
from evalsite.services import membership_set, user_get_or_create
from runs import metrics


def median_ms(client: Client, url: str, requests: int, **headers) -> float:
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(url, **headers)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()

    run, revisions = metrics_bench.seed(args.scenarios)
    # What the refresh after the cells does: per-scenario statistics (the table sorts on them).
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)
    run.refresh_from_db()
    user = user_get_or_create(username="bench-viewer")
    membership_set(project=run.project, user=user, role=Role.VIEWER)
    client = Client()
    client.force_login(user)
    base = f"/p/{run.project.slug}/runs/{run.pk}/"
    score = next(
        m["column"]["name"] for m in run.mappings if m["column"]["name"].endswith(".score")
    )
    table = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    results = {
        "run page": median_ms(client, base, args.requests),
        f"table page (50 rows sorted by {score}, descending)": median_ms(
            client, f"{base}?sort=-{score}&page=7", args.requests, **table
        ),
        "drill-in": median_ms(client, f"{base}scenarios/54321/", args.requests),
        "progress fragment": median_ms(
            client, f"{base}progress", args.requests, HTTP_HX_REQUEST="true"
        ),
    }
    print(
        f"run {run.pk} with {args.scenarios:,} scenarios x {len(revisions)} evaluators; median of {args.requests}:"
    )
    for name, ms in results.items():
        print(f"  {name:<55} {ms:8.1f} ms")


if __name__ == "__main__":
    main()
