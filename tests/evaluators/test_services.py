"""Evaluator services: creation with defaults and presets, revisions, immutability, invoke."""

import pytest

from evalsite.errors import InvalidInput
from evaluators.models import EvaluatorRevision, ImmutableRevision
from evaluators.normalize import Unrepresentable, normalize
from evaluators.services import evaluation_invoke, evaluator_create, evaluator_revise


def test_it_fills_defaults_for_missing_parameters(project):
    evaluator = evaluator_create(project=project, kind="exact_match", name="Exact")
    assert evaluator.head.parameters == {
        "correct_answer_key": "correct_answer",
        "case_sensitive": True,
        "strip_whitespace": True,
    }
    assert evaluator.head.slug == "exact-v1"
    assert evaluator.head.schemas["outputs"]["properties"]["success"]["type"] == "boolean"
    assert "properties" in evaluator.head.schemas["parameters"]


def test_it_applies_a_preset_under_given_parameters(project):
    evaluator = evaluator_create(
        project=project,
        kind="regex",
        name="Polite",
        preset="no_apology",
        parameters={"case_sensitive": True},
    )
    assert evaluator.head.parameters["should_match"] is False
    assert "sorry" in evaluator.head.parameters["pattern"]
    assert evaluator.head.parameters["case_sensitive"] is True


def test_it_refuses_an_unknown_preset_naming_it(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(project=project, kind="regex", name="x", preset="nope")
    assert "nope" in caught.value.fields["preset"][0]


def test_it_refuses_an_unknown_kind_and_saves_nothing(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(project=project, kind="telepathy", name="x")
    assert "telepathy" in caught.value.fields["kind"][0]
    assert not project.evaluators.exists()


def test_it_names_a_bad_regex(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project, kind="regex", name="Bad", parameters={"pattern": "(unclosed"}
        )
    assert "not a valid regular expression" in caught.value.fields["parameters.pattern"][0]
    assert not project.evaluators.exists()


def test_it_names_an_unknown_setting(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project, kind="regex", name="x", parameters={"pattern": "a", "patern": "b"}
        )
    assert caught.value.fields["parameters.patern"] == ["unknown setting for this kind"]


def test_it_makes_a_new_revision_when_parameters_change(project, owner):
    evaluator = evaluator_create(
        project=project, kind="regex", name="Digits", parameters={"pattern": r"\d"}
    )
    revision = evaluator_revise(
        evaluator=evaluator, parameters={"pattern": r"\d+"}, author=owner, message="greedy"
    )
    assert revision.version == 2
    assert revision.slug == "digits-v2"
    assert revision.message == "greedy"
    evaluator.refresh_from_db()
    assert evaluator.head == revision
    assert (
        EvaluatorRevision.objects.get(version=1, evaluator=evaluator).parameters["pattern"] == r"\d"
    )


def test_it_merges_a_partial_edit(project):
    evaluator = evaluator_create(
        project=project,
        kind="regex",
        name="D",
        parameters={"pattern": "a", "case_sensitive": False},
    )
    revision = evaluator_revise(
        evaluator=evaluator, parameters={"should_match": False}, partial=True
    )
    assert revision.parameters == {
        "pattern": "a",
        "case_sensitive": False,
        "should_match": False,
        "timeout_s": 1.0,
    }


def test_it_makes_no_revision_when_nothing_changed(project):
    evaluator = evaluator_create(
        project=project, kind="regex", name="D", parameters={"pattern": "a"}
    )
    assert evaluator_revise(evaluator=evaluator, parameters={"pattern": "a"}) is None
    assert evaluator.revisions.count() == 1


def test_it_keeps_revisions_immutable(project):
    revision = evaluator_create(
        project=project, kind="regex", name="D", parameters={"pattern": "a"}
    ).head
    revision.parameters = {"pattern": "b"}
    with pytest.raises(ImmutableRevision):
        revision.save()
    with pytest.raises(ImmutableRevision):
        revision.save(update_fields=["parameters"])
    revision.refresh_from_db()
    assert revision.parameters["pattern"] == "a"


def test_it_evaluates_with_a_revision(project):
    revision = evaluator_create(project=project, kind="exact_match", name="E").head
    result = evaluation_invoke(
        revision=revision, inputs={"correct_answer": "Paris"}, outputs="Paris"
    )
    assert result.status == "success"
    assert result.outputs == {"success": True}
    assert result.error is None
    assert result.duration_ms >= 0


def test_it_records_a_missing_ground_truth_as_an_error_not_a_zero(project):
    result = evaluation_invoke(
        kind="exact_match", parameters={}, inputs={"country": "France"}, outputs="Paris"
    )
    assert result.status == "error"
    assert result.outputs is None
    assert result.error["code"] == "missing_ground_truth"
    assert "correct_answer" in result.error["message"]
    assert "country" in result.error["message"]


def test_it_reports_an_outputs_schema_mismatch_naming_the_field(project):
    evaluator = evaluator_create(
        project=project,
        kind="regex",
        name="R",
        parameters={"pattern": "a"},
        outputs_schema={"type": "object", "properties": {"success": {"type": "string"}}},
    )
    result = evaluation_invoke(revision=evaluator.head, inputs={}, outputs="a")
    assert result.status == "error"
    assert result.error["code"] == "schema_mismatch"
    assert "at success" in result.error["message"]


def test_it_refuses_an_invalid_outputs_schema(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project,
            kind="regex",
            name="R",
            parameters={"pattern": "a"},
            outputs_schema={"type": 12},
        )
    assert "outputs_schema" in caught.value.fields


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, {"success": True}),
        (0.7, {"score": 0.7, "success": True}),
        (0, {"score": 0, "success": False}),
        (1, {"score": 1, "success": True}),
        ("0.25", {"score": 0.25, "success": False}),
        ("fine", {"output": "fine"}),
        ({"score": 0.9, "details": {"a": 1}}, {"score": 0.9, "details": {"a": 1}}),
    ],
)
def test_it_normalises_return_values(value, expected):
    assert normalize(value) == expected


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (None, "None"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        ({1, 2}, "set"),
        ({"score": float("nan")}, "score"),
        (Unrepresentable("undefined"), "undefined"),
    ],
)
def test_it_refuses_values_that_are_not_scores(value, named):
    from evaluators.normalize import EvaluationError

    with pytest.raises(EvaluationError) as caught:
        normalize(value)
    assert named in caught.value.message
    assert "expected a bool" in caught.value.message


def test_it_uses_an_integer_threshold():
    assert normalize(3, threshold=3) == {"score": 3, "success": True}
