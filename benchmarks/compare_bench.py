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

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from evalsite.services import project_create, user_get_or_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs import compare, metrics  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create_logged  # noqa: E402
from runs.models import Run, Testset, TestsetVersion  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number"}, "success": {"type": "boolean"}},
}
# Deterministic per-row scores: the candidate moves each row's score by -0.045 .. +0.055.
SCORE = {
    "a": "round(((s.index::bigint * 7919) %% 10007)::numeric / 10007, 4)",
    "b": "round(least(1, ((s.index::bigint * 7919) %% 10007)::numeric / 10007 "
    "+ (((s.index::bigint * 104729) %% 1000)::numeric / 1000 - 0.45) / 10), 4)",
}


def seed(n: int) -> tuple[Run, Run, str, object]:
    stamp = time.strftime("%Y%m%d%H%M%S")
    owner = user_get_or_create(username=f"bench-{stamp}", password=secrets.token_urlsafe(16))
    project = project_create(name=f"compare bench {stamp}", slug=f"compare-{stamp}", owner=owner)
    testset = Testset.objects.create(project=project, slug="questions", name="Questions")
    version = TestsetVersion.objects.create(
        project=project, testset=testset, version=1, columns=["question", "answer"], row_count=n
    )
    testset.head = version
    testset.save(update_fields=["head"])
    judge = evaluator_create(project=project, kind="feedback", name="Judge", outputs_schema=SCHEMA)
    app = application_create(project=project, name="app", kind="logged")
    runs = [
        run_create_logged(
            project=project,
            name=f"run {label}",
            testset_version=version,
            application=app,
            revisions=[judge.head],
        )
        for label in ("a", "b")
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO runs_testcase (project_id, version_id, index, data)
               SELECT %s, %s, g, jsonb_build_object('question', 'What is ' || g || '?', 'answer', 'a' || g)
               FROM generate_series(0, %s - 1) g""",
            [project.pk, version.pk, n],
        )
        for label, run in zip(("a", "b"), runs, strict=True):
            _seed_run(cursor, run, version, judge, SCORE[label])
        cursor.execute(
            "ANALYZE runs_result; ANALYZE runs_annotation; ANALYZE runs_scenario; "
            "ANALYZE runs_trace; ANALYZE runs_span; ANALYZE runs_testcase"
        )
    cells = n * 3
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        status="errors",
        finished_at=timezone.now(),
        progressed_at=timezone.now(),
        scenario_count=n,
        total_cells=cells,
        done_cells=cells,
        error_cells=n // 100,
    )
    # The read model as the engine leaves it at a run's end (runs.engine.read_model_refresh):
    # per-scenario statistics and values (ScenarioValue, which the comparison reads), then the
    # run-wide statistics, which mark it current (metrics_refreshed_at).
    for run in runs:
        run.refresh_from_db()
        metrics.scenarios_refresh(run=run, scenario_ids=None)
        metrics.run_refresh(run=run)
    with connection.cursor() as cursor:  # as autovacuum leaves them after a bulk write
        cursor.execute("VACUUM ANALYZE runs_scenariovalue")
        cursor.execute("VACUUM ANALYZE runs_scenario")
    return runs[0], runs[1], project.slug, owner


def _seed_run(cursor, run: Run, version, judge, score_sql: str) -> None:
    steps = {s.type: s.key for s in run.steps.all()}
    p = {
        "project": run.project_id,
        "run": run.pk,
        "version": version.pk,
        "input": steps["input"],
        "invocation": steps["invocation"],
        "step": steps["annotation"],
        "revision": judge.head_id,
        "evaluator": judge.pk,
        "slug": judge.slug,
    }
    cursor.execute(
        """INSERT INTO runs_scenario (project_id, run_id, index, testcase_id, inputs, status, created_at, updated_at)
           SELECT %(project)s, %(run)s, t.index, t.id, t.data,
                  CASE WHEN t.index %% 100 = 7 THEN 'errors' ELSE 'success' END, now(), now()
           FROM runs_testcase t WHERE t.version_id = %(version)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_trace (project_id, trace_id, name, root_span_id, start_time, end_time, duration_ms,
                                   status, tokens, cost, span_count, source, session_id, created_at, updated_at)
           SELECT %(project)s, md5(%(run)s || '-' || s.index), 'app', 'root', now(), now(), 100 + s.index %% 900,
                  'ok', 20, 0.0001, 1, 'invocation', '', now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_span (project_id, trace_id, span_id, parent_id, name, kind, start_time, end_time,
                                  status, status_message, trace_time, attributes)
           SELECT %(project)s, t.id, 'root', '', 'app', 'workflow', now(), now(), 'ok', '', t.created_at,
                  jsonb_build_object('ag', jsonb_build_object('data', jsonb_build_object(
                      'inputs', s.inputs, 'outputs', 'Answer ' || s.index || ' from run ' || %(run)s)))
           FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
           WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, testcase_id,
                                    created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(input)s, 0, 'success', s.testcase_id, now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, trace_id,
                                    duration_ms, created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(invocation)s, 0, 'success', t.id, t.duration_ms, now(), now()
           FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
           WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        f"""WITH annotated AS (
                INSERT INTO runs_annotation (project_id, trace_id, span_id, outputs, evaluator_id, evaluator_slug,
                                             revision_id, origin, channel, details, history, created_at, updated_at)
                SELECT %(project)s, t.id, 'root',
                       jsonb_build_object('score', {score_sql}, 'success', {score_sql} >= 0.5),
                       %(evaluator)s, %(slug)s, %(revision)s, 'auto', 'api',
                       jsonb_build_object('scenario', s.id), '[]', now(), now()
                FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
                WHERE s.run_id = %(run)s AND s.index %% 100 <> 7
                RETURNING id, (details->>'scenario')::bigint AS scenario_id
            )
            INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, annotation_id,
                                     duration_ms, created_at, updated_at)
            SELECT %(project)s, %(run)s, scenario_id, %(step)s, 0, 'success', id, 1, now(), now()
            FROM annotated""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, error,
                                    created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(step)s, 0, 'error',
                  '{"code": "judge_timeout", "type": "TimeoutError", "message": "no answer in 30 s"}'::jsonb,
                  now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s AND s.index %% 100 = 7""",
        p,
    )


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
