"""The client's typed models cannot drift from the server: each one is checked against the
OpenAPI schema of the operation that answers it (field names, required-ness, nulls, types),
generated in-process; the parts the schema leaves free-form are checked against live answers
in test_client_api.py, and the vocabularies (statuses, verdicts, history classes) here."""

from __future__ import annotations

import numpy as np
import pytest
from drf_spectacular.generators import SchemaGenerator
from evalsite_client import models
from evalsite_client.reports import VERDICT_MARKS

from runs.compare.stats import paired_test
from runs.history import CLASSES, VERDICTS
from runs.models import ACTIVE_RUN_STATUSES, RunStatus
from tests.client.drift import FREE_FORM, response, schema_drift

ANSWERS = [
    (models.Project, "/api/v1/project", "get", "200", None),
    (models.Testset, "/api/v1/testsets/{ref}", "get", "200", None),
    (models.Application, "/api/v1/applications", "get", "200", "items"),
    (models.Run, "/api/v1/runs/{run_id}", "get", "200", None),
    (models.Run, "/api/v1/runs", "post", "201", None),
    (models.Estimate, "/api/v1/runs", "post", "200", "estimate"),
    (models.Comparison, "/api/v1/runs/compare", "get", "200", None),
    (models.History, "/api/v1/testsets/{ref}/history", "get", "200", None),
    (models.ScenarioTable, "/api/v1/runs/{run_id}/scenarios", "get", "200", None),
]


@pytest.fixture(scope="module")
def schema():
    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.mark.parametrize(("model", "path", "method", "status", "part"), ANSWERS)
def test_the_model_matches_the_schema_of_the_answer(schema, model, path, method, status, part):
    node = response(schema, path, method, status)
    if part == "items":
        node = node["items"]
    elif part:
        node = node["properties"][part]
    assert schema_drift(schema, model, node) == []


def test_the_nested_models_are_checked_where_the_schema_describes_them(schema):
    for model, path, method, status, _ in ANSWERS:
        schema_drift(schema, model, response(schema, path, method, status))
    # Described by the schema, so checked above: TestsetVersion, RunStep, EstimateStep,
    # HistoryCase, HistoryRun. Free-form JSON in the schema, so checked live:
    assert {"RunTestset", "ComparisonRun", "MetricComparison", "ComparedRow"} <= FREE_FORM
    assert not FREE_FORM & {"TestsetVersion", "RunStep", "EstimateStep", "HistoryCase"}


def test_a_field_the_server_renames_is_caught(schema):
    class Renamed(models.Run):
        finished: str | None = None  # the server says finished_at

    problems = schema_drift(schema, Renamed, response(schema, "/api/v1/runs/{run_id}"))
    assert problems == [
        f"Renamed.finished: not in the schema (has: {problems[0].split('has: ')[1]}"
    ]


def test_the_client_knows_the_servers_statuses_verdicts_and_classes():
    assert set(models.ACTIVE_STATUSES) == set(ACTIVE_RUN_STATUSES)
    assert set(models.FINISHED_STATUSES) <= set(RunStatus.values)
    worse = paired_test(np.ones(40), np.zeros(40), binary=True)["verdict"]
    better = paired_test(np.zeros(40), np.ones(40), binary=True)["verdict"]
    same = paired_test(np.ones(40), np.ones(40), binary=True)["verdict"]
    assert (worse, better, same) == ("worse", "better", "inconclusive")
    assert {"regressed", "flaky"} <= set(CLASSES)
    assert set(VERDICT_MARKS) == set(VERDICTS)
