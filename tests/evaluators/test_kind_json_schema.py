import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
}


def run(outputs, schema=PERSON, **parameters):
    return evaluation_invoke(
        kind="json_schema",
        parameters={"json_schema": schema, **parameters},
        inputs={},
        outputs=outputs,
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("json_schema"), parameters)
    return caught.value.fields


def test_it_succeeds_for_a_valid_output():
    result = run({"name": "Ada", "age": 36})
    assert result.status == "success"
    assert result.outputs == {"success": True, "errors": 0, "message": ""}


def test_it_parses_a_string_output_as_json():
    assert run('{"name": "Ada", "age": 36}').outputs["success"] is True


def test_it_counts_violations_and_explains_one():
    result = run({"name": 7})
    assert result.status == "success"
    assert result.outputs["success"] is False
    assert result.outputs["errors"] == 2
    assert result.outputs["message"]


def test_it_says_where_a_violation_is():
    result = run({"name": "Ada", "age": -1})
    assert result.outputs["errors"] == 1
    assert result.outputs["message"] == "at age: -1 is less than the minimum of 0"


def test_it_fails_an_output_that_is_not_json():
    result = run("Ada, 36")
    assert result.outputs["success"] is False
    assert result.outputs["errors"] == 1
    assert result.outputs["message"].startswith("The output is not JSON")


def test_it_can_validate_the_string_itself():
    schema = {"type": "string", "pattern": "^[A-Z]"}
    assert run("Ada", schema).outputs["success"] is False  # not JSON when parsed
    assert run("Ada", schema, parse_strings=False).outputs["success"] is True


def test_it_treats_an_empty_schema_as_any_json():
    assert run("[1, 2]", {}).outputs["success"] is True


def test_it_checks_formats_only_when_asked():
    schema = {"type": "string", "format": "email"}
    assert run('"not-an-email"', schema).outputs["success"] is True
    assert run('"not-an-email"', schema, check_formats=True).outputs["success"] is False
    assert run('"ada@example.com"', schema, check_formats=True).outputs["success"] is True


def test_it_follows_local_refs():
    schema = {"$defs": {"age": {"type": "integer"}}, "$ref": "#/$defs/age"}
    assert run("36", schema).outputs["success"] is True
    assert run('"36"', schema).outputs["success"] is False


def test_it_does_not_fetch_remote_refs(http_server):
    schema = {"$ref": f"{http_server.url}/person.json"}
    result = run({"name": "Ada"}, schema)
    assert result.status == "error"
    assert result.error["code"] == "invalid_schema"
    assert "does not fetch remote schemas" in result.error["message"]
    assert http_server.requests == []


def test_it_refuses_an_invalid_schema():
    fields = refused(json_schema={"type": "object", "properties": {"age": {"type": "integr"}}})
    assert fields["parameters.json_schema"][0].startswith(
        "not a valid JSON Schema at properties/age/type:"
    )


def test_it_refuses_a_schema_that_is_not_an_object():
    assert "parameters.json_schema" in refused(json_schema=["type", "object"])


def test_it_requires_a_schema():
    assert refused() == {"parameters.json_schema": ["Field required"]}


def test_it_has_valid_presets():
    kind = get_kind("json_schema")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
