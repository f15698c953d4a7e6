"""Seeding for the read-path benchmarks (compare, export, scale): one testset of ``n`` rows and
finished logged runs over it, in set-based SQL (generate_series), then the read model as the
engine leaves it at a run's end.

Each run has an input and an invocation step (a trace with its root span per scenario) and one
annotation step per judge; scores are deterministic per testcase index, and each later run moves
each score by -0.045 .. +0.055. Indexes ending in 07 (1 %) have every judge cell errored.

Imported by the benchmark scripts beside it (``import runs_seed``), so it takes the checkout the
script runs (``EVALSITE_ROOT`` in export_bench) for everything it calls.
"""

from __future__ import annotations

import time

from django.db import connection, transaction
from django.utils import timezone

from evalsite.models import Project
from evalsite.services import project_create
from evaluators.services import evaluator_create
from runs import metrics
from runs.applications import application_create
from runs.engine import run_create_logged
from runs.models import Run, Testset, TestsetVersion

# The score of each run, per testcase index (``m.index``).
SCORES = (
    "round(((m.index::bigint * 7919) %% 10007)::numeric / 10007, 4)",
    "round(least(1, ((m.index::bigint * 7919) %% 10007)::numeric / 10007 "
    "+ (((m.index::bigint * 104729) %% 1000)::numeric / 1000 - 0.45) / 10), 4)",
)
# A judge's outputs as SQL over ``{score}`` and ``m`` (the scenario map below).
SCORE_AND_SUCCESS = "jsonb_build_object('score', {score}, 'success', {score} >= 0.5)"
SCORE_AND_SUCCESS_SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number"}, "success": {"type": "boolean"}},
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
    "runs_scenariovaluepack",
)


@transaction.atomic
def runs_seed(
    n: int,
    *,
    slug: str,
    owner,
    run_names: tuple[str, ...],
    judges: dict[str, tuple[str, dict | None]],
) -> Project:
    """A project ``slug`` with a testset of ``n`` rows and one finished run per name, judged by
    ``judges`` (name: (outputs SQL, outputs schema or None to let the refresh infer it)). The
    read model is not refreshed: see ``read_model_refresh``. All of it or nothing."""
    project = project_create(name=slug.replace("-", " "), slug=slug, owner=owner)
    testset = Testset.objects.create(project=project, slug="questions", name="Questions")
    version = TestsetVersion.objects.create(
        project=project, testset=testset, version=1, columns=["question", "answer"], row_count=n
    )
    testset.head = version
    testset.save(update_fields=["head"])
    revisions = []
    for name, (_, schema) in judges.items():
        extra = {"outputs_schema": schema} if schema else {}
        revisions.append(
            evaluator_create(project=project, kind="feedback", name=name, **extra).head
        )
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
        for name in run_names
    ]
    outputs = [sql for sql, _ in judges.values()]
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
        for i, run in enumerate(runs):
            score = SCORES[min(i, len(SCORES) - 1)]
            _run_seed(cursor, run, version, revisions, [o.format(score=score) for o in outputs])
        # What autovacuum does while a big run fills: plans for the refresh see the rows.
        cursor.execute("".join(f"ANALYZE {table}; " for table in TABLES[:6]))
    errored = len(range(7, n, 100))  # indexes ending in 07: every judge cell errored
    cells = n * (2 + len(revisions))
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        status="errors",
        finished_at=timezone.now(),
        progressed_at=timezone.now(),
        scenario_count=n,
        total_cells=cells,
        done_cells=cells,
        error_cells=errored * len(revisions),
    )
    return project


def read_model_refresh(runs: list[Run]) -> dict[str, float]:
    """What the engine does at a run's end (per-scenario statistics and the read model, then
    run-wide, which marks it current), for runs not refreshed yet, then what autovacuum does to
    the new rows. The seconds each took, by name."""
    timings: dict[str, float] = {}
    for i, run in enumerate(runs):
        if run.metrics_refreshed_at is not None:  # an earlier invocation got this far
            continue
        started = time.perf_counter()
        metrics.scenarios_refresh(run=run, scenario_ids=None)
        timings[f"scenarios_refresh run {i + 1}"] = time.perf_counter() - started
        started = time.perf_counter()
        metrics.run_refresh(run=run)
        timings[f"run_refresh run {i + 1}"] = time.perf_counter() - started
    unpacked = set(
        metrics.runs_unpacked().filter(pk__in=[r.pk for r in runs]).values_list("pk", flat=True)
    )
    for i, run in enumerate(runs):  # and packs them for comparisons, as the engine does next
        if run.pk in unpacked:
            started = time.perf_counter()
            metrics.values_pack(run=run)
            timings[f"values_pack run {i + 1}"] = time.perf_counter() - started
    if timings:
        started = time.perf_counter()
        present = [t for t in TABLES if t in connection.introspection.table_names()]
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {', '.join(present)}")
        timings["VACUUM ANALYZE"] = time.perf_counter() - started
    for run in runs:
        run.refresh_from_db()
    return timings


def _run_seed(cursor, run: Run, version, revisions, outputs: list[str]) -> None:
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
    for revision, outputs_sql in zip(revisions, outputs, strict=True):
        _annotations_seed(cursor, run, revision, outputs_sql, p)
    cursor.execute("DROP TABLE scale_map")


def _annotations_seed(cursor, run: Run, revision, outputs_sql: str, p: dict) -> None:
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
