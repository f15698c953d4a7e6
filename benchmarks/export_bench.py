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

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import timezone  # noqa: E402

from evalsite.models import Project  # noqa: E402
from evalsite.services import project_create, user_get_or_create  # noqa: E402
from evaluators.services import evaluator_create  # noqa: E402
from runs import metrics  # noqa: E402
from runs.applications import application_create  # noqa: E402
from runs.engine import run_create_logged  # noqa: E402
from runs.models import Run, Testset, TestsetVersion  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "number"}, "success": {"type": "boolean"}},
}
# Deterministic scores; the second run moves each by -0.045 .. +0.055.
SCORES = (
    "round(((s.index::bigint * 7919) %% 10007)::numeric / 10007, 4)",
    "round(least(1, ((s.index::bigint * 7919) %% 10007)::numeric / 10007 "
    "+ (((s.index::bigint * 104729) %% 1000)::numeric / 1000 - 0.45) / 10), 4)",
)


def seed(n: int) -> Project:
    stamp = time.strftime("%Y%m%d%H%M%S")
    owner = user_get_or_create(username=f"export-bench-{stamp}", password=secrets.token_urlsafe(16))
    project = project_create(
        name=f"export bench {n} {stamp}", slug=f"export-bench-{n}-{stamp}", owner=owner
    )
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
            name=f"run {i}",
            testset_version=version,
            application=app,
            revisions=[judge.head],
        )
        for i in range(2)
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_testcase (project_id, version_id, index, data) "
            "SELECT %s, %s, g, jsonb_build_object('question', 'What is ' || g || '?', "
            "'answer', 'a' || g) FROM generate_series(0, %s - 1) g",
            [project.pk, version.pk, n],
        )
        for run, score in zip(runs, SCORES, strict=True):
            _seed_run(cursor, run, version, judge, score)
        cursor.execute(
            "ANALYZE runs_result; ANALYZE runs_annotation; ANALYZE runs_scenario; "
            "ANALYZE runs_trace; ANALYZE runs_span; ANALYZE runs_testcase"
        )
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(
        status="errors",
        finished_at=timezone.now(),
        progressed_at=timezone.now(),
        scenario_count=n,
        total_cells=n * 3,
        done_cells=n * 3,
        error_cells=n // 100,
    )
    for run in runs:  # the read model, as the engine leaves it at a run's end
        run.refresh_from_db()
        metrics.scenarios_refresh(run=run, scenario_ids=None)
        metrics.run_refresh(run=run)
    return project


def _seed_run(cursor, run: Run, version, judge, score: str) -> None:
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
        """INSERT INTO runs_scenario (project_id, run_id, index, testcase_id, inputs, status,
                                      created_at, updated_at)
           SELECT %(project)s, %(run)s, t.index, t.id, t.data,
                  CASE WHEN t.index %% 100 = 7 THEN 'errors' ELSE 'success' END, now(), now()
           FROM runs_testcase t WHERE t.version_id = %(version)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_trace (project_id, trace_id, name, root_span_id, start_time, end_time,
                                   duration_ms, status, tokens, cost, span_count, source,
                                   session_id, created_at, updated_at)
           SELECT %(project)s, md5(%(run)s || '-' || s.index), 'app', 'root', now(), now(),
                  100 + s.index %% 900, 'ok', 20, 0.0001, 1, 'invocation', '', now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_span (project_id, trace_id, span_id, parent_id, name, kind, start_time,
                                  end_time, status, status_message, trace_time, attributes)
           SELECT %(project)s, t.id, 'root', '', 'app', 'workflow', now(), now(), 'ok', '',
                  t.created_at, jsonb_build_object('ag', jsonb_build_object('data',
                      jsonb_build_object('inputs', s.inputs,
                                         'outputs', 'Answer ' || s.index || ' from run ' || %(run)s)))
           FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
           WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status,
                                    testcase_id, created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(input)s, 0, 'success', s.testcase_id, now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status,
                                    trace_id, duration_ms, created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(invocation)s, 0, 'success', t.id, t.duration_ms,
                  now(), now()
           FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
           WHERE s.run_id = %(run)s""",
        p,
    )
    cursor.execute(
        f"""WITH annotated AS (
                INSERT INTO runs_annotation (project_id, trace_id, span_id, outputs, evaluator_id,
                                             evaluator_slug, revision_id, origin, channel, details,
                                             history, created_at, updated_at)
                SELECT %(project)s, t.id, 'root',
                       jsonb_build_object('score', {score}, 'success', {score} >= 0.5),
                       %(evaluator)s, %(slug)s, %(revision)s, 'auto', 'api',
                       jsonb_build_object('scenario', s.id), '[]', now(), now()
                FROM runs_scenario s JOIN runs_trace t ON t.trace_id = md5(%(run)s || '-' || s.index)
                WHERE s.run_id = %(run)s AND s.index %% 100 <> 7
                RETURNING id, (details->>'scenario')::bigint AS scenario_id
            )
            INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status,
                                     annotation_id, duration_ms, created_at, updated_at)
            SELECT %(project)s, %(run)s, scenario_id, %(step)s, 0, 'success', id, 1, now(), now()
            FROM annotated""",
        p,
    )
    cursor.execute(
        """INSERT INTO runs_result (project_id, run_id, scenario_id, step_key, repeat_idx, status,
                                    error, created_at, updated_at)
           SELECT %(project)s, %(run)s, s.id, %(step)s, 0, 'error',
                  '{"code": "judge_timeout", "type": "TimeoutError", "message": "no answer in 30 s"}',
                  now(), now()
           FROM runs_scenario s WHERE s.run_id = %(run)s AND s.index %% 100 = 7""",
        p,
    )


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
