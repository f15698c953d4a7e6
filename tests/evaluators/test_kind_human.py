import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate, schemas_for


def schema_for(parameters: dict) -> dict:
    kind = get_kind("human")
    return kind.outputs_schema(parameters_validate(kind, parameters))


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("human"), parameters)
    return caught.value.fields


def test_it_asks_for_a_score_and_an_optional_comment_by_default():
    assert schema_for({}) == {
        "type": "object",
        "properties": {
            "score": {
                "type": "number",
                "minimum": 1,
                "maximum": 5,
                "description": "1 (bad) to 5 (good)",
            },
            "comment": {"type": "string"},
        },
        "required": ["score"],
        "additionalProperties": False,
    }


def test_it_builds_the_outputs_schema_from_the_fields():
    fields = [
        {"name": "helpful", "type": "boolean"},
        {"name": "tone", "type": "categorical", "choices": ["formal", "casual"]},
        {"name": "errors", "type": "integer", "min": 0},
        {"name": "note", "type": "string", "required": False, "description": "Anything else"},
    ]
    assert schema_for({"fields": fields}) == {
        "type": "object",
        "properties": {
            "helpful": {"type": "boolean"},
            "tone": {"type": "string", "enum": ["formal", "casual"]},
            "errors": {"type": "integer", "minimum": 0},
            "note": {"type": "string", "description": "Anything else"},
        },
        "required": ["helpful", "tone", "errors"],
        "additionalProperties": False,
    }


def test_it_stores_the_schema_with_the_revision_schemas():
    kind = get_kind("human")
    parsed = parameters_validate(kind, {"fields": [{"name": "ok", "type": "boolean"}]})
    assert schemas_for(kind, parsed)["outputs"]["required"] == ["ok"]


def test_it_is_annotated_by_people_not_run():
    result = evaluation_invoke(kind="human", parameters={}, inputs={}, outputs="Paris")
    assert result.status == "skipped"
    assert result.outputs is None
    assert result.error["code"] == "skipped"


def test_it_refuses_a_categorical_field_without_choices():
    fields = refused(fields=[{"name": "tone", "type": "categorical"}])
    assert fields == {"parameters.fields.0": ["tone: a categorical field needs choices"]}


def test_it_refuses_choices_and_bounds_on_the_wrong_types():
    assert (
        "choices apply only"
        in refused(fields=[{"name": "score", "type": "number", "choices": ["1"]}])[
            "parameters.fields.0"
        ][0]
    )
    assert (
        "min and max apply only"
        in refused(fields=[{"name": "ok", "type": "boolean", "max": 1}])["parameters.fields.0"][0]
    )


def test_it_refuses_min_above_max():
    fields = refused(fields=[{"name": "score", "type": "number", "min": 5, "max": 1}])
    assert fields == {"parameters.fields.0": ["score: min (5) is above max (1)"]}


def test_it_refuses_repeated_names_and_names_that_are_not_metric_keys():
    assert refused(
        fields=[{"name": "score", "type": "number"}, {"name": "score", "type": "string"}]
    ) == {"parameters.fields": ["field names must be unique; repeated: score"]}
    assert (
        "not a valid field name"
        in refused(fields=[{"name": "a.b", "type": "string"}])["parameters.fields.0.name"][0]
    )


def test_it_refuses_unknown_types_and_an_empty_form():
    assert "parameters.fields.0.type" in refused(fields=[{"name": "x", "type": "date"}])
    assert "parameters.fields" in refused(fields=[])


def test_it_has_valid_presets():
    kind = get_kind("human")
    for preset in kind.presets:
        kind.outputs_schema(parameters_validate(kind, preset.parameters))
