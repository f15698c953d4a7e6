"""How a comparison reads its values: from a finished run's packs (ScenarioValuePack) while they
are of its last refresh, else from the read model (ScenarioValue, one COPY for every run) when it
holds the runs' cells, the same figures as digging them out of the results; from the results for
what it does not hold; and a constant number of queries per page, however many scenarios the
runs have."""

from __future__ import annotations

import io
from datetime import timedelta

import numpy as np
import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evaluators.services import evaluator_create
from runs import compare, engine, metrics
from runs.applications import application_create
from runs.engine import results_log, run_close, run_create_logged
from runs.metrics.packs import indexes_encode, pack_encode
from runs.models import Application, Run, RunStatus, ScenarioValue, ScenarioValuePack
from tests.runs.test_compare import JUDGE_SCHEMA, questions, scored_run, scores

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "compare-rows"}
NAN = float("nan")


@pytest.fixture
def judge(project):
    nullable = {**JUDGE_SCHEMA["properties"], "score": {"type": ["number", "null"]}}
    schema = {**JUDGE_SCHEMA, "properties": nullable}
    return evaluator_create(
        project=project, kind="feedback", name="Judge", slug="judge", outputs_schema=schema
    )


def repeated_run(project, version, revision, name: str) -> Run:
    """A closed logged run of 6 scenarios, with cells of two repeats: values to average, errors
    beside values, an error alone, keys missing or null, and a scenario never judged."""
    app = Application.objects.filter(project=project, slug="logged").first()
    app = app or application_create(project=project, name="Logged", slug="logged", kind="logged")
    run = run_create_logged(
        project=project, name=name, testset_version=version, application=app, revisions=[revision]
    )
    steps = {s.type: s.key for s in run.steps.all()}
    judged = {
        0: [{"score": 0.2, "success": True}, {"score": 0.6, "success": False}],
        1: ["timeout", {"score": 0.9, "success": True}],  # one repeat errored, one valued
        2: ["timeout", "timeout"],  # errored, no value
        3: [{"success": True}],  # no score at all: neither a value nor an error
        4: [{"score": None, "success": False}],  # a JSON null is no value either
    }
    entries = []
    for index in range(6):
        entries.append({"scenario": index, "step_key": steps["input"]})
        for repeat, cell in enumerate(judged.get(index, [])):
            entries.append(
                {
                    "scenario": index,
                    "step_key": steps["invocation"],
                    "repeat_idx": repeat,
                    "outputs": f"{name} answer {index}.{repeat}",
                }
            )
            entry = {"scenario": index, "step_key": steps["annotation"], "repeat_idx": repeat}
            if isinstance(cell, str):
                entry["error"] = {"code": cell, "message": "no answer"}
            else:
                entry["outputs"] = cell
            entries.append(entry)
    results_log(run=run, entries=entries)
    run = run_close(run=run)
    engine.read_model_pack(run_id=run.pk)  # what the task the close queued does
    return run


def values_read(run: Run, comparison) -> tuple[compare.RunValues, list[str]]:
    """The run's values, read afresh (the per-process cache cleared), and the statements."""
    compare.values_cache_clear()
    with CaptureQueriesContext(connection) as queries:
        found = compare.run_values(run, comparison.metrics)
    return found, [q["sql"] for q in queries.captured_queries]


def assert_same(a: compare.RunValues, b: compare.RunValues) -> None:
    assert np.array_equal(a.present, b.present) and a.binary == b.binary
    assert a.values.keys() == b.values.keys() == a.errors.keys() == b.errors.keys()
    for name in a.values:
        assert np.array_equal(a.values[name], b.values[name], equal_nan=True), name
        assert np.array_equal(a.errors[name], b.errors[name]), name


def test_it_reads_the_same_values_from_the_read_model_as_from_the_results(project, judge):
    version = questions(project, 6)
    run = repeated_run(project, version, judge.head, "repeated")
    other = repeated_run(project, version, judge.head, "other")
    comparison = compare.comparison_get(project=project, run_ids=[str(run.pk), str(other.pk)])
    from_read_model, statements = values_read(run, comparison)
    assert any(sql.startswith("COPY (") for sql in statements)
    assert not any("runs_annotation" in sql for sql in statements)

    # Without its packs, from the read model's rows.
    ScenarioValuePack.objects.filter(run=run).delete()
    from_rows, statements = values_read(run, comparison)
    assert any(sql.startswith("COPY (") for sql in statements)
    assert_same(from_read_model, from_rows)

    # The read model behind its run's last cell: the values come from the results.
    Run.objects.filter(pk=run.pk).update(metrics_refreshed_at=None)
    run.refresh_from_db()
    from_results, statements = values_read(run, comparison)
    assert not any(sql.startswith("COPY (") for sql in statements)
    assert any("runs_annotation" in sql for sql in statements)

    assert_same(from_read_model, from_results)
    score, success = from_read_model.values["judge.score"], from_read_model.values["judge.success"]
    np.testing.assert_allclose(score, [0.4, 0.9, NAN, NAN, NAN, NAN])
    np.testing.assert_allclose(success, [0.5, 1.0, NAN, 1.0, 0.0, NAN])
    assert from_read_model.errors["judge.score"].tolist() == [False, False, True] + [False] * 3
    assert from_read_model.errors["judge.success"].tolist() == [False, False, True] + [False] * 3
    assert from_read_model.present.all() and len(from_read_model.present) == 6


def test_it_reads_a_key_the_read_model_has_no_row_of_from_the_results(project, judge):
    version = questions(project, 6)
    runs = [repeated_run(project, version, judge.head, name) for name in ("a", "b")]
    comparison = compare.comparison_get(project=project, run_ids=[str(r.pk) for r in runs])
    expected, _ = values_read(runs[0], comparison)
    ScenarioValue.objects.filter(run=runs[0], key="score").delete()
    ScenarioValuePack.objects.filter(run=runs[0], key="score").delete()
    found, statements = values_read(runs[0], comparison)
    assert any(sql.startswith("COPY (") for sql in statements)  # success, from the read model
    assert any("runs_annotation" in sql for sql in statements)  # score, from the results
    assert_same(found, expected)


def test_it_leaves_out_scenarios_without_a_testcase(project, judge):
    version = questions(project, 3)
    runs = [scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]), n) for n in "ab"]
    extra = runs[0].scenarios.get(index=2)
    extra.testcase = None  # as if added to a logged run beside its testset's rows
    extra.save(update_fields=["testcase"])
    metrics.values_pack(run=runs[0])  # its packs, of the scenarios as they are now
    values = compare.comparison_values(
        compare.comparison_get(project=project, run_ids=[str(r.pk) for r in runs])
    )
    base = values[runs[0].pk]
    assert base.present.tolist() == [True, True, False]
    assert np.isnan(base.values["judge.score"][2]) and not base.errors["judge.score"][2]


# --- packs ---------------------------------------------------------------------------------------


def test_closing_a_run_queues_its_packing_on_a_worker(
    project, judge, celery_eager, django_capture_on_commit_callbacks
):
    version = questions(project, 3)
    with django_capture_on_commit_callbacks() as queued:
        run = scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]))
    # The close refreshed the read model in its request but did not pack it there.
    assert run.metrics_refreshed_at and not ScenarioValuePack.objects.filter(run=run).exists()
    for callback in queued:  # the commit: the task runs (eagerly here, on a worker in a site)
        callback()
    run.refresh_from_db()
    stamps = set(ScenarioValuePack.objects.filter(run=run).values_list("refreshed_at", flat=True))
    assert stamps == {run.metrics_refreshed_at}
    scenarios = ScenarioValuePack.objects.get(run=run, key="")
    assert scenarios.count == 3 and bytes(scenarios.indexes) == b""  # 0 to 2: a count


def test_the_sweep_packs_finished_runs_that_lost_their_pack_task(
    project, judge, celery_eager, django_capture_on_commit_callbacks
):
    version = questions(project, 3)
    # Neither close's pack task ran (their commits never came here): as if the broker lost them.
    lost, fresh = (
        scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]), name)
        for name in ("lost", "fresh")
    )
    earlier = lost.metrics_refreshed_at - engine.PACK_GRACE - timedelta(seconds=1)
    Run.objects.filter(pk=lost.pk).update(metrics_refreshed_at=earlier)

    with django_capture_on_commit_callbacks(execute=True):
        assert engine.read_model_packs_sweep() == 1  # the fresh run's own task is still due

    stamps = set(ScenarioValuePack.objects.filter(run=lost).values_list("refreshed_at", flat=True))
    assert stamps == {earlier}
    assert not ScenarioValuePack.objects.filter(run=fresh).exists()
    with django_capture_on_commit_callbacks(execute=True):
        assert engine.read_model_packs_sweep() == 0  # packed now: nothing left to sweep


def test_a_refresh_already_packed_is_not_packed_again(project, judge):
    version = questions(project, 3)
    run = scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]))
    assert engine.read_model_pack(run_id=run.pk) > 1
    ids = set(ScenarioValuePack.objects.filter(run=run).values_list("pk", flat=True))
    assert engine.read_model_pack(run_id=run.pk) == 0  # a second task for the same refresh
    assert set(ScenarioValuePack.objects.filter(run=run).values_list("pk", flat=True)) == ids


def test_a_finished_runs_comparison_reads_its_packs_while_they_are_current(project, judge):
    version = questions(project, 6)
    run, other = (repeated_run(project, version, judge.head, name) for name in ("r", "o"))
    pack = ScenarioValuePack.objects.get(run=run, step_key="", key="")
    assert pack.refreshed_at == run.metrics_refreshed_at  # packed after the run was closed
    assert pack.count == 6 and bytes(pack.indexes) == b""  # 0 to 5: a count, no bytes
    comparison = compare.comparison_get(project=project, run_ids=[str(run.pk), str(other.pk)])
    expected, _ = values_read(run, comparison)

    # The rows change behind the packs (as no refresh would leave them): the packs are read.
    ScenarioValue.objects.filter(run=run, value__isnull=False).update(value=42)
    packed, _ = values_read(run, comparison)
    assert_same(packed, expected)
    np.testing.assert_allclose(packed.values["judge.score"], [0.4, 0.9, NAN, NAN, NAN, NAN])
    assert packed.errors["judge.score"].tolist() == [False, False, True] + [False] * 3

    # A refresh since the packs (stamped later): they are stale, the rows are read.
    Run.objects.filter(pk=run.pk).update(
        metrics_refreshed_at=run.metrics_refreshed_at + timedelta(seconds=1)
    )
    run.refresh_from_db()
    rows, _ = values_read(run, comparison)
    np.testing.assert_allclose(rows.values["judge.score"], [42, 42, NAN, NAN, NAN, NAN])
    assert rows.errors["judge.score"].tolist() == [False, False, True] + [False] * 3


def test_a_refresh_packs_the_run_again_with_its_stamp(
    project, judge, celery_eager, django_capture_on_commit_callbacks
):
    version = questions(project, 6)
    run, other = (repeated_run(project, version, judge.head, name) for name in ("r", "o"))
    comparison = compare.comparison_get(project=project, run_ids=[str(run.pk), str(other.pk)])
    expected, _ = values_read(run, comparison)
    ScenarioValue.objects.filter(run=run, key="score", value__isnull=False).update(value=42)
    ScenarioValuePack.objects.filter(run=run).update(numbers=b"")  # as if packed wrong

    with django_capture_on_commit_callbacks(execute=True):  # the pack task it queues runs
        engine.read_model_refresh(run_id=run.pk)  # the engine's refresh, on Celery

    run.refresh_from_db()
    stamps = set(ScenarioValuePack.objects.filter(run=run).values_list("refreshed_at", flat=True))
    assert stamps == {run.metrics_refreshed_at}
    found, _ = values_read(run, comparison)
    # Packed again from the rows as the refresh leaves them (it recomputes only the scenarios
    # whose cells landed since: none here), not the emptied packs.
    np.testing.assert_allclose(found.values["judge.score"], [42, 42, NAN, NAN, NAN, NAN])
    assert np.array_equal(found.present, expected.present)
    assert all(np.array_equal(found.errors[k], expected.errors[k]) for k in expected.errors)


def test_a_schema_backfill_packs_the_run_again(
    project, judge, celery_eager, django_capture_on_commit_callbacks
):
    version = questions(project, 3)
    run = scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]))
    engine.read_model_pack(run_id=run.pk)
    before = ScenarioValuePack.objects.get(run=run, step_key="", key="").refreshed_at
    with django_capture_on_commit_callbacks(execute=True):
        metrics.run_mappings_and_metrics_refresh(run_id=run.pk)
    run.refresh_from_db()
    assert run.metrics_refreshed_at > before
    stamps = set(ScenarioValuePack.objects.filter(run=run).values_list("refreshed_at", flat=True))
    assert stamps == {run.metrics_refreshed_at}


def test_the_command_packs_runs_finished_before_packs(project, judge):
    version = questions(project, 3)
    run = scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]))
    ScenarioValuePack.objects.filter(run=run).delete()  # as a run from before migration 0013
    out = io.StringIO()
    call_command("values_pack", "--dry-run", "--project", "acme", stdout=out)
    assert f"Would pack run {run.pk}" in out.getvalue()
    assert not ScenarioValuePack.objects.filter(run=run).exists()

    call_command("values_pack", stdout=out)
    stamps = set(ScenarioValuePack.objects.filter(run=run).values_list("refreshed_at", flat=True))
    assert stamps == {run.metrics_refreshed_at}
    out = io.StringIO()
    call_command("values_pack", stdout=out)
    assert out.getvalue().startswith("Nothing to pack")


@pytest.mark.parametrize(
    ("values", "dtype", "scale"),
    [
        ([1.0, 0.0, NAN, 1.0], "i1", 0),  # pass/fail
        ([0.5, 1.0, 0.25, NAN], "i1", 2),  # means over repeats
        ([0.1234, 0.9999, 0.0, -0.5], "i2", 4),  # a score of four decimals
        ([120.0, 4_500.0, 31_000.0], "i2", 0),  # latencies in ms
        ([45_000.0, 1.5], "i4", 1),
        ([0.0001, 12.5, 3e9], "f8", 0),  # 3e9 * 10 ** 4 is no integer of 4 bytes
        ([1 / 3, 0.5], "f8", 0),  # no power of ten gives 1/3 back
        ([0.1 + 0.2], "f8", 0),  # 0.30000000000000004: not the double nearest any short decimal
        ([float("inf"), 1.0], "f8", 0),
        ([-0.0, 1.0], "f8", 0),  # an integer has no sign of zero
        ([NAN, NAN], "i1", 0),
        ([], "i1", 0),
    ],
)
def test_a_pack_takes_the_narrowest_shape_that_gives_back_the_same_doubles(values, dtype, scale):
    values = np.array(values, dtype=np.float64)
    found = pack_encode(values)
    assert found[:2] == (dtype, scale)
    decoded = metrics.pack_decode(*found)
    assert decoded.tobytes() == values.tobytes()  # the very same doubles, NaN where NaN was


def test_decimals_packed_as_integers_come_back_bit_for_bit():
    rng = np.random.default_rng(7)
    for places in range(7):
        values = np.round(rng.uniform(-200, 200, 50_000), places) + 0.0  # no -0.0
        dtype, scale, data = pack_encode(values)
        assert dtype != "f8" and scale <= places
        assert metrics.pack_decode(dtype, scale, data).tobytes() == values.tobytes()
    noise = rng.random(50_000)  # arbitrary doubles stay as they are
    assert pack_encode(noise)[:2] == ("f8", 0)


def test_indexes_0_to_n_are_packed_as_their_count():
    dense = np.arange(5, dtype=">i4").tobytes()
    gappy = np.array([0, 1, 3], dtype=">i4").tobytes()
    late = np.array([1, 2, 3], dtype=">i4").tobytes()
    assert indexes_encode(dense) == (5, b"")
    assert indexes_encode(gappy) == (3, gappy)
    assert indexes_encode(late) == (3, late)
    assert indexes_encode(b"") == (0, b"")


def test_a_pack_with_gaps_reads_the_same_values_as_the_rows(project, judge):
    version = questions(project, 6)
    run, other = (repeated_run(project, version, judge.head, name) for name in ("r", "o"))
    packs = ScenarioValuePack.objects.filter(run=run)
    assert set(packs.values_list("indexes", flat=True)) == {b""}  # all of them dense
    score = packs.get(key="score")
    assert (score.dtype, score.scale) == ("i1", 1)  # 0.4 and 0.9: tenths, 1 byte each
    # Scenario 1 loses its values (as if its cells were removed): the packs have a gap.
    ScenarioValue.objects.filter(run=run, index=1).delete()
    packs.delete()
    metrics.values_pack(run=run)
    assert bytes(packs.get(key="score").indexes) != b""
    comparison = compare.comparison_get(project=project, run_ids=[str(run.pk), str(other.pk)])
    packed, _ = values_read(run, comparison)
    packs.delete()
    rows, _ = values_read(run, comparison)
    assert_same(packed, rows)
    np.testing.assert_allclose(packed.values["judge.score"], [0.4, NAN, NAN, NAN, NAN, NAN])


def test_a_running_run_is_not_packed_and_loses_its_packs(project, judge):
    version = questions(project, 3)
    run = scored_run(project, version, judge.head, scores([0.1, 0.2, 0.3]))
    engine.read_model_pack(run_id=run.pk)
    keys = set(ScenarioValuePack.objects.filter(run=run).values_list("step_key", "key"))
    assert ("", "") in keys and {k for _, k in keys} >= {"score", "success", "duration"}
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)  # resumed, say
    run.refresh_from_db()
    assert metrics.values_pack(run=run) == 0
    assert not ScenarioValuePack.objects.filter(run=run).exists()


# --- query counts -----------------------------------------------------------------------------


def pair_of(project, judge, n: int, slug: str) -> tuple[Run, Run]:
    version = questions(project, n, slug)
    values = [round(i / n, 3) for i in range(n)]
    values[1] = "boom"  # an errored cell on every page
    return tuple(
        scored_run(project, version, judge.head, scores(values), f"{slug} {name}")
        for name in ("base", "cand")
    )


def count_queries(get, url: str, **headers) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert get(url, **headers).status_code == 200
    return len(queries.captured_queries)


@pytest.mark.parametrize("cold", [True, False], ids=["cold", "cached"])
def test_it_reads_3_and_30_scenarios_with_as_many_queries(
    viewer_client, viewer_api, project, judge, cold
):
    counts = {}
    for n in (3, 30):
        base, cand = pair_of(project, judge, n, f"n{n}")
        ids = f"runs={base.pk},{cand.pk}"
        urls = {
            "page": (viewer_client.get, f"/p/acme/runs/compare?{ids}", {}),
            "rows": (viewer_client.get, f"/p/acme/runs/compare?{ids}&filter=changed", HTMX),
            "api": (viewer_api.get, f"/api/v1/runs/compare?{ids}", {}),
        }
        for name, (get, url, headers) in urls.items():
            get(url, **headers)  # sessions, permissions and the cache as a second view finds them
            if cold:
                compare.values_cache_clear()
            counts[(name, n)] = count_queries(get, url, **headers)
    for name in ("page", "rows", "api"):
        assert counts[(name, 3)] == counts[(name, 30)], (name, counts)


def test_connections_start_with_jit_off(db):
    """A comparison's statement carries a row scan per part for a run without packs; at a
    million scenarios their estimates cross jit_above_cost, and PostgreSQL compiled the plan on
    every first view (~70 ms) for scans that never ran. The setting comes with the connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setting, source FROM pg_settings WHERE name = 'jit'")
        assert cursor.fetchone() == ("off", "client")
