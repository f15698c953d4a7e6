import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def run(outputs, **parameters):
    return evaluation_invoke(
        kind="contains_json", parameters=parameters, inputs={}, outputs=outputs
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("contains_json"), parameters)
    return caught.value.fields


def test_it_finds_an_object_inside_prose():
    result = run('Sure! Here it is: {"city": "Paris", "rank": 1}. Anything else?')
    assert result.status == "success"
    assert result.outputs == {"success": True}


def test_it_finds_json_in_a_fence():
    text = 'The answer:\n```json\n[{"id": 1}, {"id": 2}]\n```\n'
    assert run(text).outputs == {"success": True}


def test_it_fails_text_without_json():
    assert run("Paris is the capital of France.").outputs == {"success": False}


def test_it_fails_broken_json():
    assert run('{"city": "Paris",}').outputs == {"success": False}


def test_it_does_not_count_a_json_scalar():
    assert run("42").outputs == {"success": False}
    assert run('"a string"').outputs == {"success": False}


def test_it_accepts_an_output_that_already_is_json():
    assert run({"a": 1}).outputs == {"success": True}
    assert run([1, 2]).outputs == {"success": True}
    assert run(42).outputs == {"success": False}


def test_it_can_require_an_object():
    assert run("[1, 2, 3]", json_type="object").outputs == {"success": False}
    assert run('list: [1, {"a": 2}]', json_type="object").outputs == {"success": True}


def test_it_can_require_an_array():
    assert run('{"a": 1}', json_type="array").outputs == {"success": False}
    assert run('{"a": [1]}', json_type="array").outputs == {"success": True}


def test_it_survives_deeply_nested_brackets():
    result = run("[" * 5000)
    assert result.status == "success"
    assert result.outputs == {"success": False}


def test_it_refuses_an_unknown_json_type():
    assert "parameters.json_type" in refused(json_type="string")


def test_it_refuses_unknown_settings():
    assert refused(strict=True) == {"parameters.strict": ["unknown setting for this kind"]}


def test_it_has_valid_presets():
    kind = get_kind("contains_json")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
