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
  score descending, the middle page (``?page=`` half-way through the run);
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

from django.conf import settings  # noqa: E402
from django.core.cache import caches  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from evalsite.models import Project  # noqa: E402
from evalsite.services import project_create, user_get_or_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs import compare, metrics  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create_logged  # noqa: E402
from runs.models import Run, Testset, TestsetVersion  # noqa: E402

USER = "scale-bench"
RUN_NAMES = ("scale baseline", "scale candidate")
# Deterministic scores per testcase index; the candidate moves each by -0.045 .. +0.055.
SCORE = (
    "round(((m.index::bigint * 7919) %% 10007)::numeric / 10007, 4)",
    "round(least(1, ((m.index::bigint * 7919) %% 10007)::numeric / 10007 "
    "+ (((m.index::bigint * 104729) %% 1000)::numeric / 1000 - 0.45) / 10), 4)",
)
OUTPUTS = {
    "score": "jsonb_build_object('score', {score})",
    "success": "jsonb_build_object('success', {score} >= 0.4)",
    "label": "jsonb_build_object('label', (ARRAY['good', 'bad', 'meh'])[1 + m.index %% 3])",
}
TABLES = (
    "runs_testcase",
    "runs_scenario",
    "runs_trace",
    "runs_span",
    "runs_result",
    "runs_annotation",
    "runs_runmetrics",
    "runs_scenariovalue",
)
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
        project = _seed(n, slug, owner)
        timings["seed SQL"] = time.perf_counter() - started
    runs = [Run.objects.get(project=project, name=name) for name in RUN_NAMES]
    for i, run in enumerate(runs):
        if run.metrics_refreshed_at is None:  # fresh, or an earlier invocation stopped here
            started = time.perf_counter()
            metrics.scenarios_refresh(run=run, scenario_ids=None)
            timings[f"scenarios_refresh run {i + 1}"] = time.perf_counter() - started
            started = time.perf_counter()
            metrics.run_refresh(run=run)
            timings[f"run_refresh run {i + 1}"] = time.perf_counter() - started
    if timings:
        started = time.perf_counter()
        present = [t for t in TABLES if t in connection.introspection.table_names()]
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {', '.join(present)}")
        timings["VACUUM ANALYZE"] = time.perf_counter() - started
    for run in runs:
        run.refresh_from_db()
    return runs[0], runs[1], timings


@transaction.atomic
def _seed(n: int, slug: str, owner) -> Project:
    project = project_create(name=f"scale bench {slug}", slug=slug, owner=owner)
    testset = Testset.objects.create(project=project, slug="questions", name="Questions")
    version = TestsetVersion.objects.create(
        project=project, testset=testset, version=1, columns=["question", "answer"], row_count=n
    )
    testset.head = version
    testset.save(update_fields=["head"])
    # No outputs schemas (seed 002's case): the first refresh infers them, as in metrics_bench.
    revisions = [
        evaluator_create(project=project, kind="feedback", name=f"judge {key}").head
        for key in OUTPUTS
    ]
    app = application_create(project=project, name="app", kind="logged")
    # The runs are created before the testcases exist, so their scenarios are seeded in SQL.
    runs = [
        run_create_logged(
            project=project,
            name=name,
            testset_version=version,
            application=app,
            revisions=revisions,
        )
        for name in RUN_NAMES
    ]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL work_mem = '256MB'; SET LOCAL synchronous_commit = off")
        # Foreign keys are checked row by row at COMMIT (deferred triggers): at 1M that took
        # longer than the inserts. These rows are consistent by construction, so a superuser
        # seeds without the triggers; anyone else waits for the checks.
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if cursor.fetchone()[0]:
            cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            """INSERT INTO runs_testcase (project_id, version_id, index, data)
               SELECT %s, %s, g, jsonb_build_object('question', 'What is ' || g || '?', 'answer', 'a' || g)
               FROM generate_series(0, %s - 1) g""",
            [project.pk, version.pk, n],
        )
        for run, score in zip(runs, SCORE, strict=True):
            _seed_run(cursor, run, version, revisions, score)
        # What autovacuum does while a big run fills: plans for the refresh see the rows.
        cursor.execute("".join(f"ANALYZE {table}; " for table in TABLES[:6]))
    errored = len(range(7, n, 100))  # indexes ending in 07: every evaluator cell errored
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        status="errors",
        finished_at=timezone.now(),
        progressed_at=timezone.now(),
        scenario_count=n,
        total_cells=n * 5,
        done_cells=n * 5,
        error_cells=errored * len(revisions),
    )
    return project


def _seed_run(cursor, run: Run, version, revisions, score: str) -> None:
    steps = {s.type: s.key for s in run.steps.all() if s.type != "annotation"}
    p = {
        "project": run.project_id,
        "run": run.pk,
        "version": version.pk,
        "input": steps["input"],
        "invocation": steps["invocation"],
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
    # Fresh statistics, or the join below is planned for empty tables (a nested loop: hours at 1M).
    cursor.execute("ANALYZE runs_scenario; ANALYZE runs_trace")
    # Scenario, testcase and trace of each index, joined once for the inserts below.
    cursor.execute(
        """CREATE TEMP TABLE scale_map ON COMMIT DROP AS
           SELECT s.index, s.id AS scenario_id, s.testcase_id, s.inputs, t.id AS trace_id,
                  t.created_at AS trace_time, t.duration_ms
           FROM runs_scenario s JOIN runs_trace t
             ON t.project_id = %(project)s AND t.trace_id = md5(%(run)s || '-' || s.index)
           WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute("ANALYZE scale_map")
    cursor.execute(
        """INSERT INTO runs_span (project_id, trace_id, span_id, parent_id, name, kind, start_time, end_time,
                                  status, status_message, attributes, trace_time)
           SELECT %(project)s, m.trace_id, 'root', '', 'app', 'workflow', now(), now(), 'ok', '',
                  jsonb_build_object('ag', jsonb_build_object('data', jsonb_build_object(
                      'inputs', m.inputs, 'outputs', 'Answer ' || m.index || ' from run ' || %(run)s))),
                  m.trace_time
           FROM scale_map m""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, testcase_id,
                                    created_at, updated_at)
           SELECT %(project)s, %(run)s, m.scenario_id, %(input)s, 0, 'success', m.testcase_id, now(), now()
           FROM scale_map m""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, trace_id,
                                    duration_ms, created_at, updated_at)
           SELECT %(project)s, %(run)s, m.scenario_id, %(invocation)s, 0, 'success', m.trace_id, m.duration_ms,
                  now(), now()
           FROM scale_map m""",
        p,
    )
    for revision, outputs in zip(revisions, OUTPUTS.values(), strict=True):
        _seed_annotations(cursor, run, revision, outputs.format(score=score), p)
    cursor.execute("DROP TABLE scale_map")


def _seed_annotations(cursor, run: Run, revision, outputs_sql: str, p: dict) -> None:
    p = {
        **p,
        "step": run.steps.get(revision=revision).key,
        "revision": revision.pk,
        "evaluator": revision.evaluator_id,
        "slug": revision.evaluator.slug,
    }
    cursor.execute(
        f"""WITH annotated AS (
                INSERT INTO runs_annotation (project_id, trace_id, span_id, outputs, evaluator_id, evaluator_slug,
                                             revision_id, origin, channel, details, history, created_at, updated_at)
                SELECT %(project)s, m.trace_id, 'root', {outputs_sql}, %(evaluator)s, %(slug)s, %(revision)s,
                       'auto', 'api', '{{}}', '[]', now(), now()
                FROM scale_map m WHERE m.index %% 100 <> 7
                RETURNING id, trace_id
            )
            INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, annotation_id,
                                     duration_ms, created_at, updated_at)
            SELECT %(project)s, %(run)s, m.scenario_id, %(step)s, 0, 'success', a.id, 1, now(), now()
            FROM annotated a JOIN scale_map m ON m.trace_id = a.trace_id""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, error,
                                    created_at, updated_at)
           SELECT %(project)s, %(run)s, m.scenario_id, %(step)s, 0, 'error',
                  '{"code": "judge_timeout", "type": "TimeoutError", "message": "no answer in 30 s"}'::jsonb,
                  now(), now()
           FROM scale_map m WHERE m.index %% 100 = 7""",
        p,
    )


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
    table_url = f"{run_url}?sort=-{score}&page={middle}"
    table = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-scenarios"}
    drill_url = f"{run_url}scenarios/{n // 2 + 321}/"
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
