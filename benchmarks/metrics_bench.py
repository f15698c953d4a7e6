"""Metrics benchmark: a run of 100,000 scenarios with 3 annotation steps (numeric score,
boolean success, categorical label; 1 % errors) plus invocation traces, seeded in SQL. Times the
per-scenario refresh of every scenario (what writes the read model), a run-wide refresh (the
inferred schemas checked against the number of outputs, and every step's statistics), schema
inference over the 297,000 stored outputs, and the per-scenario refresh of one scenario.

    uv run python benchmarks/metrics_bench.py [--scenarios 100000] [--repeat 5]

Targets on a 2-core machine (issue 17): run-wide refresh <= 400 ms, inference <= 400 ms.
The evaluators are registered without outputs schemas (seed 002's case), so their schemas are
inferred from the data (by the first per-scenario refresh, then checked by each run-wide one).
The history is seeded as autovacuum leaves it (statistics, visibility map); the read model is
measured right after it is written, then after autovacuum's pass over it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")

import django

django.setup()

from django.db import connection  # noqa: E402

from evalsite.services import project_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs import metrics  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create_logged  # noqa: E402

STEPS = {
    "score": "jsonb_build_object('score', round(random()::numeric, 4))",
    "success": "jsonb_build_object('success', random() > 0.3)",
    "label": "jsonb_build_object('label', (ARRAY['good', 'bad', 'meh'])[1 + floor(random() * 3)::int])",
}


def seed(n: int):
    stamp = time.strftime("%Y%m%d%H%M%S")
    project = project_create(
        name=f"metrics bench {stamp}", slug=f"metrics-bench-{stamp}", owner=None
    )
    app = application_create(project=project, name="logged", kind="logged")
    revisions = [
        evaluator_create(project=project, kind="feedback", name=f"judge {key}").head
        for key in STEPS
    ]
    run = run_create_logged(project=project, name="bench", application=app, revisions=revisions)
    steps = {s.key: s for s in run.steps.all()}
    invocation = next(k for k, s in steps.items() if s.type == "invocation")
    params = {"project": project.pk, "run": run.pk, "n": n, "invocation": invocation}
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO runs_scenario (project_id, run_id, index, inputs, status, created_at, updated_at)
               SELECT %(project)s, %(run)s, g, jsonb_build_object('q', g), 'success', now(), now()
               FROM generate_series(0, %(n)s - 1) g""",
            params,
        )
        cursor.execute(
            """INSERT INTO runs_trace (project_id, trace_id, name, root_span_id, start_time, end_time, duration_ms,
                                       status, tokens, cost, span_count, source, session_id, created_at, updated_at)
               SELECT %(project)s, md5(%(run)s || '-' || g), 'app', 'root', now(), now(), random() * 2000,
                      'ok', floor(random() * 800), random() / 1000, 1, 'invocation', '', now(), now()
               FROM generate_series(0, %(n)s - 1) g""",
            params,
        )
        cursor.execute(
            """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, trace_id,
                                        duration_ms, created_at, updated_at)
               SELECT %(project)s, %(run)s, s.id, %(invocation)s, 0, 'success', t.id, t.duration_ms, now(), now()
               FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
               WHERE s.run_id = %(run)s""",
            params,
        )
        for revision, (_key, outputs_sql) in zip(revisions, STEPS.items(), strict=True):
            step_key = f"evaluator-{revision.slug}"
            values = {
                **params,
                "revision": revision.pk,
                "evaluator": revision.evaluator_id,
                "slug": revision.evaluator.slug,
                "step": step_key,
            }
            cursor.execute(
                f"""INSERT INTO runs_annotation (project_id, trace_id, span_id, outputs, evaluator_id, evaluator_slug,
                                                revision_id, origin, channel, details, history, created_at, updated_at)
                    SELECT %(project)s, r.trace_id, 'root', {outputs_sql}, %(evaluator)s, %(slug)s, %(revision)s,
                           'auto', 'api', jsonb_build_object('scenario', r.scenario_id), '[]', now(), now()
                    FROM runs_result r WHERE r.run_id = %(run)s AND r.step_key = %(invocation)s
                      AND r.scenario_id %% 100 <> 0""",
                values,
            )
            cursor.execute(
                """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, annotation_id,
                                            duration_ms, created_at, updated_at)
                   SELECT %(project)s, %(run)s, (a.details->>'scenario')::bigint, %(step)s, 0, 'success', a.id,
                          random() * 5, now(), now()
                   FROM runs_annotation a WHERE a.revision_id = %(revision)s""",
                values,
            )
            cursor.execute(
                """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status, error,
                                            created_at, updated_at)
                   SELECT %(project)s, %(run)s, s.id, %(step)s, 0, 'error',
                          '{"code": "evaluator_exception", "message": "boom"}'::jsonb, now(), now()
                   FROM runs_scenario s WHERE s.run_id = %(run)s AND s.id %% 100 = 0""",
                values,
            )
    # The stored history as autovacuum leaves it: statistics, and the visibility map that lets
    # a count of a revision's outputs read its index alone.
    with connection.cursor() as cursor:
        for table in ("runs_result", "runs_annotation", "runs_scenario", "runs_trace"):
            cursor.execute(f"VACUUM ANALYZE {table}")
    run.scenario_count = n
    run.save(update_fields=["scenario_count"])
    return run, revisions


def timed(fn, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    run, revisions = seed(args.scenarios)
    print(
        f"seeded {args.scenarios:,} scenarios, {args.scenarios * 4:,} results in {time.perf_counter() - started:.1f} s"
    )

    # What the engine does when a run ends: every scenario's values (the read model), then run-wide.
    written = timed(lambda: metrics.scenarios_refresh(run=run, scenario_ids=None), 1)[0]
    fresh = timed(lambda: metrics.run_refresh(run=run), 1)[0]
    with connection.cursor() as cursor:  # autovacuum's pass after 100,000s of new rows
        for table in ("runs_runmetrics", "runs_scenariovalue"):
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
            if cursor.fetchone()[0]:
                cursor.execute(f"VACUUM ANALYZE {table}")
    refresh = timed(lambda: metrics.run_refresh(run=run), args.repeat)
    data = run.metrics.get(scenario=None).data
    infer = timed(lambda: [metrics.schema_infer(revision_id=r.pk) for r in revisions], args.repeat)
    scenarios = list(run.scenarios.order_by("?")[:20])
    per_scenario = [
        timed(lambda s=s: metrics.scenarios_refresh(run=run, scenario_ids=[s.pk]), 1)[0]
        for s in scenarios
    ]

    def runs(times: list[float]) -> str:
        return ", ".join(f"{t:.0f}" for t in times)

    outputs = sum(r.annotations.count() for r in revisions)
    print(
        f"per-scenario refresh of all {args.scenarios:,} scenarios (infers the 3 schemas): {written:.0f} ms"
    )
    print(f"run-wide refresh right after it (read model not vacuumed yet): {fresh:.0f} ms")
    print(
        f"run-wide refresh (incl. the inference check of 3 schemas): median {statistics.median(refresh):.0f} ms  (runs: {runs(refresh)})"
    )
    print(
        f"schema inference over {outputs:,} outputs: median {statistics.median(infer):.0f} ms  (runs: {runs(infer)})"
    )
    print(
        f"per-scenario refresh of one scenario: median {statistics.median(per_scenario):.1f} ms, max {max(per_scenario):.1f} ms (20 scenarios)"
    )
    for step, stats in data.items():
        if step.startswith("evaluator-"):
            summary = {
                k: {
                    kk: v.get(kk)
                    for kk in ("mean", "rate", "count", "errors", "percentiles", "frequencies")
                    if kk in v
                }
                for k, v in stats.items()
                if k not in ("duration", "errors")
            }
            print(f"  {step}: {summary}")


if __name__ == "__main__":
    main()
