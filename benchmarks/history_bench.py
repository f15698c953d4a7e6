"""Test-case history benchmark: a testset of 200 cases and 20 finished runs of it with one
evaluator (a boolean ``success``; planted stable, flaky, regressed, fixed and errored cases),
seeded with COPY (runs/bulk.py). Times the history page (the grid of 200 cases x 20 runs) and
its class-filtered HTMX fragment as the server renders them through Django's test client
(middleware, session, template), the history API, and the service alone; median of
``--requests``.

    uv run python benchmarks/history_bench.py [--cases 200] [--runs 20] [--requests 20]

Target on a 2-core machine: the page < 150 ms. ``--testset <project>/<slug>`` reuses a
testset seeded by an earlier invocation.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from evalsite.models import Project  # noqa: E402
from evalsite.services import project_create, user_get_or_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs import history  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.bulk import copy_insert, copy_rows  # noqa: E402
from runs.engine import run_create_logged  # noqa: E402
from runs.models import Annotation, Result, Run, Testcase, Testset, TestsetVersion  # noqa: E402

SCHEMA = {"type": "object", "properties": {"success": {"type": "boolean"}}}


def verdict(index: int, run: int, runs: int) -> bool | None:
    """The planted verdict of a case in a run (None: the evaluator errored)."""
    kind = index % 10
    if kind == 0:  # flaky: fails every third run, shifted per case
        return (run + index) % 3 != 0
    if kind == 1:  # regressed in the newest run
        return run < runs - 1
    if kind == 2:  # fixed in the newest run
        return run == runs - 1
    if kind == 3:  # stable fail
        return False
    if kind == 4 and run % 5 == 0:  # errors now and then: not a verdict
        return None
    return True


@transaction.atomic
def seed(cases: int, runs: int) -> tuple[Testset, object]:
    stamp = time.strftime("%Y%m%d%H%M%S")
    owner = user_get_or_create(username=f"bench-{stamp}", password=secrets.token_urlsafe(16))
    project = project_create(name=f"history bench {stamp}", slug=f"history-{stamp}", owner=owner)
    testset = Testset.objects.create(project=project, slug="questions", name="Questions")
    version = TestsetVersion.objects.create(
        project=project, testset=testset, version=1, columns=["question", "answer"], row_count=cases
    )
    testset.head = version
    testset.save(update_fields=["head"])
    copy_insert(
        [
            Testcase(
                project=project,
                version=version,
                index=i,
                data={"question": f"What is {i} + {i}?", "answer": str(2 * i)},
            )
            for i in range(cases)
        ]
    )
    judge = evaluator_create(project=project, kind="feedback", name="Judge", outputs_schema=SCHEMA)
    app = application_create(project=project, name="app", kind="logged")
    start = timezone.now() - timedelta(days=runs)
    for r in range(runs):
        run = run_create_logged(
            project=project,
            name=f"nightly {r + 1}",
            testset_version=version,
            application=app,
            revisions=[judge.head],
            tags={"branch": "main", "commit": f"{r:07x}"},
        )
        _seed_cells(run, judge, cases, r, runs)
        Run.objects.filter(pk=run.pk).update(
            status="errors",
            created_at=start + timedelta(days=r),
            finished_at=start + timedelta(days=r, minutes=5),
            done_cells=run.total_cells,
        )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_result; ANALYZE runs_annotation; ANALYZE runs_scenario")
    return testset, owner


def _seed_cells(run: Run, judge, cases: int, r: int, runs: int) -> None:
    step = run.steps.get(type="annotation").key
    scenarios = dict(run.scenarios.values_list("index", "id"))
    now = timezone.now()
    annotations = [
        Annotation(
            project_id=run.project_id,
            outputs={"success": verdict(i, r, runs)},
            evaluator=judge,
            evaluator_slug=judge.slug,
            revision_id=judge.head_id,
            created_at=now,
            updated_at=now,
        )
        for i in range(cases)
        if verdict(i, r, runs) is not None
    ]
    copy_insert(annotations, with_ids=True)
    annotation_ids = iter(a.pk for a in annotations)
    rows = []
    for i in range(cases):
        ok = verdict(i, r, runs) is not None
        error = None if ok else {"code": "judge_timeout", "message": "no answer in 30 s"}
        rows.append(
            (
                run.project_id,
                run.pk,
                scenarios[i],
                step,
                0,
                "success" if ok else "error",
                next(annotation_ids) if ok else None,
                error,
                now,
                now,
            )
        )
    copy_rows(
        Result,
        [
            "project_id",
            "run_id",
            "scenario_id",
            "step_key",
            "repeat_idx",
            "status",
            "annotation_id",
            "error",
            "created_at",
            "updated_at",
        ],
        rows,
    )


def median_ms(fn, requests: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), times


def get_ok(client: Client, url: str, **headers):
    response = client.get(url, **headers)
    assert response.status_code == 200, (url, response.status_code, response.content[:500])
    return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--testset", default="", help="Reuse a seeded testset: <project>/<slug>.")
    args = parser.parse_args()
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    started = time.perf_counter()
    if args.testset:
        slug, ref = args.testset.split("/", 1)
        project = Project.objects.get(slug=slug)
        testset = Testset.objects.get(project=project, slug=ref)
        owner = project.memberships.get().user
    else:
        testset, owner = seed(args.cases, args.runs)
        print(
            f"seeded {args.cases} cases x {args.runs} runs in {time.perf_counter() - started:.1f} s "
            f"(reuse with --testset {testset.project.slug}/{testset.slug})"
        )
    slug = testset.project.slug
    client = Client()
    client.force_login(owner)
    page_url = f"/p/{slug}/testsets/{testset.slug}/history?runs={args.runs}"
    api_url = f"/api/v1/testsets/{testset.slug}/history?runs={args.runs}&project={slug}"
    get_ok(client, page_url)  # warm-up: connection, templates, imports

    service, statements = [], []
    with connection.execute_wrapper(lambda execute, *a: service.append(1) or execute(*a)):
        found = history.testcase_history(testset=testset, runs=args.runs)
    with connection.execute_wrapper(lambda execute, *a: statements.append(1) or execute(*a)):
        page = get_ok(client, page_url)
    print(
        f"grid: {len(found.cases)} rows x {len(found.runs)} runs, counts {found.counts}; "
        f"the service: {len(service)} queries; the page: {len(statements)} queries "
        f"(session, user and project included), {len(page.content) / 1024:.0f} KB of HTML"
    )
    htmx = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "history-grid"}
    for name, fn in (
        ("history page (full, 200 cases x 20 runs)", lambda: get_ok(client, page_url)),
        (
            "grid fragment, flaky only (HTMX)",
            lambda: get_ok(client, page_url + "&class=flaky", **htmx),
        ),
        ("history API (JSON, every case)", lambda: get_ok(client, api_url + "&limit=1000")),
        (
            "service alone (testcase_history)",
            lambda: history.testcase_history(testset=testset, runs=args.runs),
        ),
    ):
        median, times = median_ms(fn, args.requests)
        print(f"  {name:<45} median {median:6.1f} ms  (min {min(times):.1f}, max {max(times):.1f})")


if __name__ == "__main__":
    main()
