"""Run-wide statistics read from the read model (``ScenarioValue``) and the per-scenario rows
are the very figures the cells give; where those are not exact (repeats, scenarios not
refreshed yet, a key that appeared) the cells are read. Inference aggregates JSON types in SQL
and gives the schema it always gave."""

import math

import pytest
from django.db import connection
from django.db.models import JSONField, Value

from evaluators.services import evaluator_create
from runs import metrics
from runs.applications import application_create
from runs.engine import results_log, run_create_logged, scenarios_add
from runs.models import Annotation, InferredSchema, RunMetrics, ScenarioValue, Trace

SCENARIOS = 14


def _score(index: int):
    """Numbers, a whole one, one missing and one of the wrong type."""
    return {3: None, 8: "high", 5: 1}.get(index, (index + 1) / 16)


def _label(index: int):
    return None if index == 5 else ["good", "bad", "good", "meh"][index % 4]


def _outputs(index: int) -> dict:
    found = {"success": index % 3 != 0, "comment": f"note {index}"}
    if _score(index) is not None:
        found["score"] = _score(index)
    if _label(index) is not None:
        found["label"] = _label(index)
    return found


def _percentile(values: list, p: float) -> float:
    """PostgreSQL's percentile_cont: linear between the two nearest ranks."""
    values = sorted(values)
    rank = p * (len(values) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (rank - low)


def _logged_run(project, outputs: list, *, repeats: int = 1, errored: tuple = ()):
    """A logged run: one scenario per entry of ``outputs`` (a judge's outputs, or None for an
    errored evaluation), invocations 100 ms apart with tokens and costs on their traces."""
    app = application_create(project=project, name="Logged", kind="logged")
    judge = evaluator_create(project=project, kind="feedback", name="Judge").head
    run = run_create_logged(project=project, name="stats", application=app, revisions=[judge])
    scenarios_add(run=run, rows=[{"inputs": {"q": i}} for i in range(len(outputs))])
    steps = {s.type: s.key for s in run.steps.all()}
    entries = []
    for index, found in enumerate(outputs):
        for repeat in range(repeats):
            entries.append(
                {
                    "scenario": index,
                    "step_key": steps["invocation"],
                    "repeat_idx": repeat,
                    "outputs": f"answer {index}",
                    "duration_ms": 100.0 * (index + 1) + repeat,
                }
            )
            if index in errored:
                entries.append(
                    {
                        "scenario": index,
                        "step_key": steps["annotation"],
                        "repeat_idx": repeat,
                        "error": {"message": "boom"},
                    }
                )
            else:
                entries.append(
                    {
                        "scenario": index,
                        "step_key": steps["annotation"],
                        "repeat_idx": repeat,
                        "outputs": found(repeat) if callable(found) else found,
                    }
                )
    results_log(run=run, entries=entries)
    for n, trace in enumerate(Trace.objects.filter(project=project).order_by("pk")):
        Trace.objects.filter(pk=trace.pk).update(tokens=10 + n, cost=0.001 * (n + 1))
    return run, steps


def _close(a, b) -> bool:
    """Equal, floats to the last bits: a sum depends on the order PostgreSQL adds in."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-12)
    return a == b


def _statements(fn) -> list[str]:
    seen = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()
    return seen


def _read_model_dropped(run) -> None:
    ScenarioValue.objects.filter(run=run).delete()
    RunMetrics.objects.filter(run=run, scenario__isnull=False).delete()


def test_it_gives_the_figures_of_the_cells_from_the_read_model(project):
    errored = SCENARIOS - 1
    run, steps = _logged_run(project, [_outputs(i) for i in range(SCENARIOS)], errored=(errored,))
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    data = metrics.run_refresh(run=run)
    judge = data[steps["annotation"]]
    evaluated = range(errored)
    numbers = [_score(i) for i in evaluated if isinstance(_score(i), float | int)]
    score = judge["score"]
    assert (score["count"], score["min"], score["max"]) == (
        len(numbers),
        min(numbers),
        max(numbers),
    )
    assert score["percentiles"]["p25"] == pytest.approx(_percentile(numbers, 0.25))
    assert score["mean"] == pytest.approx(sum(numbers) / len(numbers))
    assert sum(b["count"] for b in score["histogram"]) == len(numbers)
    assert score["histogram"][-1] == {"start": pytest.approx(1 - 15 / 160), "end": 1, "count": 1}
    assert (judge["success"]["true"], judge["success"]["false"]) == (
        sum(1 for i in evaluated if i % 3 != 0),
        sum(1 for i in evaluated if i % 3 == 0),
    )
    labels = [_label(i) for i in evaluated if _label(i) is not None]
    assert {f["value"]: f["count"] for f in judge["label"]["frequencies"]} == {
        label: labels.count(label) for label in set(labels)
    }
    assert judge["comment"] == {"type": "string", "count": errored, "errors": 1}
    assert judge["errors"]["count"] == 1
    invocation = data[steps["invocation"]]
    durations = [100.0 * (i + 1) for i in range(SCENARIOS)]
    assert invocation["duration"]["count"] == SCENARIOS
    assert invocation["duration"]["percentiles"]["p90"] == pytest.approx(
        _percentile(durations, 0.9)
    )
    assert invocation["tokens"]["sum"] == sum(10 + n for n in range(SCENARIOS))

    # The same run with no read model at all: every figure comes from the cells.
    _read_model_dropped(run)
    assert _close(metrics.run_stats(run), data)


def test_it_reads_no_outputs_nor_traces_while_the_read_model_is_complete(project):
    run, _ = _logged_run(project, [_outputs(i) for i in range(SCENARIOS)])
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)
    statements = _statements(lambda: metrics.run_stats(run))
    assert not [sql for sql in statements if "a.outputs" in sql or "JOIN runs_trace" in sql]


def test_it_reads_the_cells_of_scenarios_not_refreshed_yet(project):
    run, steps = _logged_run(project, [_outputs(i) for i in range(SCENARIOS)])
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    complete = metrics.run_refresh(run=run)
    # Three scenarios' values are not written yet (their refresh is still queued).
    ScenarioValue.objects.filter(run=run, index__in=[0, 4, 7]).delete()
    RunMetrics.objects.filter(run=run, scenario__index__in=[0, 4, 7]).delete()
    statements = _statements(lambda: metrics.run_stats(run))
    assert [sql for sql in statements if "a.outputs" in sql]
    assert _close(metrics.run_stats(run), complete)
    numbers = [i for i in range(SCENARIOS) if isinstance(_score(i), float | int)]
    assert complete[steps["annotation"]]["score"]["count"] == len(numbers)


def test_it_counts_every_cell_of_scenarios_with_repeats(project):
    outputs = [lambda repeat, i=i: {"score": i + repeat / 2} for i in range(4)]
    run, steps = _logged_run(project, outputs, repeats=2)
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    score = metrics.run_refresh(run=run)[steps["annotation"]]["score"]
    cells = sorted(i + repeat / 2 for i in range(4) for repeat in range(2))
    assert (score["count"], score["min"], score["max"]) == (8, cells[0], cells[-1])
    assert score["percentiles"]["p50"] == (cells[3] + cells[4]) / 2
    duration = metrics.run_stats(run)[steps["invocation"]]["duration"]
    assert (duration["count"], duration["min"], duration["max"]) == (8, 100.0, 401.0)


def test_it_writes_every_scenarios_values_again_when_a_key_appears(project):
    run, steps = _logged_run(project, [{"score": 0.5} for _ in range(4)])
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)
    # A fifth scenario's outputs bring a new number; its refresh still reads the cached schema.
    scenarios_add(run=run, rows=[{"inputs": {"q": 4}}])
    results_log(
        run=run,
        entries=[{"scenario": 4, "step_key": steps["annotation"], "outputs": {"score": 1, "n": 3}}],
    )
    fifth = run.scenarios.get(index=4)
    metrics.scenarios_refresh(run=run, scenario_ids=[fifth.pk])
    assert not ScenarioValue.objects.filter(run=run, key="n").exists()
    data = metrics.run_refresh(run=run)  # infers "n", then writes it for every scenario
    values = dict(ScenarioValue.objects.filter(run=run, key="n").values_list("index", "value"))
    assert values == {0: None, 1: None, 2: None, 3: None, 4: 3.0}
    assert (data[steps["annotation"]]["n"]["count"], data[steps["annotation"]]["n"]["mean"]) == (
        1,
        3.0,
    )


def test_a_key_that_reads_like_sql_or_a_placeholder_is_just_a_key(project):
    keys = ["{ids}", "100%", "it's"]
    run, _ = _logged_run(project, [{k: float(i + n) for n, k in enumerate(keys)} for i in range(3)])
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    metrics.run_refresh(run=run)  # infers the keys
    second = run.scenarios.get(index=1)
    metrics.scenarios_refresh(run=run, scenario_ids=[second.pk])  # the batch statement
    metrics.scenarios_refresh(run=run, scenario_ids=None)  # the whole-run statement
    for n, key in enumerate(keys):
        values = dict(ScenarioValue.objects.filter(run=run, key=key).values_list("index", "value"))
        assert values == {i: float(i + n) for i in range(3)}, key


def test_it_removes_values_of_a_key_that_is_no_longer_a_number(project):
    run, steps = _logged_run(project, [{"score": 0.5, "tag": 1} for _ in range(3)])
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    assert ScenarioValue.objects.filter(run=run, key="tag").count() == 3
    revision = run.steps.get(key=steps["annotation"]).revision
    InferredSchema.objects.filter(revision=revision).update(
        schema={
            "type": "object",
            "properties": {"score": {"type": "number"}, "tag": {"type": "string"}},
        }
    )
    metrics.scenarios_refresh(run=run, scenario_ids=None)
    assert not ScenarioValue.objects.filter(run=run, key="tag").exists()
    assert ScenarioValue.objects.filter(run=run, key="score").count() == 3


# --- inference ----------------------------------------------------------------------------------

TRICKY = [
    {
        "score": 0.5,
        "steps": 3,
        "ok": True,
        "label": "good",
        "reason": "r0",
        "details": {"f1": 1.0, "n": 2, "deep": {"x": "a"}},
        "tags": ["a"],
        "a.b": 1,
        "": "empty",
        "mixed": 1,
    },
    "not an object",
    {
        "score": 1,
        "steps": 4,
        "ok": False,
        "label": "bad",
        "reason": "r1",
        "details": {"f1": 0.25, "n": 3},
        "tags": [],
        "mixed": 2,
    },
    None,
    [1, 2],
    {},
    {
        "score": None,
        "steps": -0,
        "ok": None,
        "label": None,
        "reason": "r2",
        "details": None,
        "mixed": "x",
    },
    {"score": "high", "steps": 1e3, "label": "good", "reason": "r3", "details": 7},
    *[
        {
            "score": i / 8,
            "steps": i,
            "ok": i % 2 == 0,
            "label": ["good", "bad", "meh"][i % 3],
            "reason": f"r{i}",
            "mixed": i,
        }
        for i in range(4, 16)
    ],
    {"score": 2.50, "steps": 5, "label": "meh", "details": {"f1": 0.5, "deep": {"x": "b"}}},
]


def _annotated(project, outputs: list):
    revision = evaluator_create(project=project, kind="feedback", name="Tricky").head
    for found in outputs:
        Annotation.objects.create(
            project=project,
            outputs=Value(None, JSONField()) if found is None else found,
            evaluator_id=revision.evaluator_id,
            evaluator_slug=revision.evaluator.slug,
            revision=revision,
            origin="auto",
            channel="api",
        )
    return revision


def test_it_infers_the_schema_of_every_kind_of_output(project):
    revision = _annotated(project, TRICKY)
    inferred = metrics.schema_infer(revision_id=revision.pk)
    nullable = {
        "score": "number",
        "steps": "number",  # 1e3 is stored as 1000.0: not whole
        "mixed": "integer",  # the majority type wins over one string
        "a.b": "integer",
        "ok": "boolean",
        "reason": "string",  # 16 distinct strings: no enum
        "tags": "array",
    }
    properties = inferred["schema"]["properties"]
    assert {k: properties[k] for k in nullable} == {
        k: {"type": [t, "null"]} for k, t in nullable.items()
    }
    assert properties["label"] == {"type": ["string", "null"], "enum": ["bad", "good", "meh", None]}
    assert properties[""] == {"type": ["string", "null"], "enum": ["empty", None]}
    assert properties["details"] == {
        "type": ["object", "null"],
        "properties": {
            "deep": {
                "type": "object",
                "properties": {"x": {"type": ["string", "null"], "enum": ["a", "b", None]}},
            },
            "f1": {"type": ["number", "null"]},
            "n": {"type": ["integer", "null"]},
        },
    }
    assert inferred["total"] == len(TRICKY)
    fields = {f["path"]: f for f in inferred["fields"]}
    assert list(fields) == sorted(fields)
    assert fields["score"]["types"] == {"number": 15, "null": 1, "string": 1}
    assert (fields["score"]["count"], fields["score"]["agree"]) == (17, 16)
    assert fields["details"]["types"] == {"number": 1, "null": 1, "object": 3}
    # Examples come from the first three outputs stored, whatever they are.
    assert fields["score"]["examples"] == ["0.5", "1"]
    assert fields["details.deep.x"]["examples"] == ['"a"']


def test_it_infers_nothing_from_no_outputs(project):
    revision = _annotated(project, [])
    assert metrics.schema_infer(revision_id=revision.pk) == {
        "schema": {"type": "object", "properties": {}},
        "total": 0,
        "fields": [],
    }


@pytest.mark.parametrize("fresh", [False, True])
def test_it_infers_again_only_when_outputs_were_added(project, fresh):
    revision = _annotated(project, [{"score": 1}])
    assert metrics.revision_outputs_schema(revision)[0]["properties"] == {
        "score": {"type": "integer"}
    }
    stamp = InferredSchema.objects.get(revision=revision).inferred_at
    metrics.revision_outputs_schema(revision, fresh=True)
    assert InferredSchema.objects.get(revision=revision).inferred_at == stamp
    _annotated_more = Annotation.objects.create(
        project=project,
        outputs={"score": 0.5},
        evaluator_id=revision.evaluator_id,
        evaluator_slug=revision.evaluator.slug,
        revision=revision,
        origin="auto",
        channel="api",
    )
    assert _annotated_more.pk
    schema, _ = metrics.revision_outputs_schema(revision, fresh=fresh)
    assert schema["properties"]["score"] == {"type": "number" if fresh else "integer"}
