import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def run(outputs, truth, **parameters):
    return evaluation_invoke(
        kind="exact_match", parameters=parameters, inputs={"correct_answer": truth}, outputs=outputs
    )


def test_it_matches_equal_text():
    result = run("Paris", "Paris")
    assert result.status == "success"
    assert result.outputs == {"success": True}


def test_it_fails_different_text():
    assert run("Lyon", "Paris").outputs == {"success": False}


def test_it_ignores_surrounding_white_space_unless_strict():
    assert run(" Paris\n", "Paris").outputs == {"success": True}
    assert run(" Paris\n", "Paris", strip_whitespace=False).outputs == {"success": False}


def test_it_can_ignore_case():
    assert run("PARIS", "paris").outputs == {"success": False}
    assert run("PARIS", "paris", case_sensitive=False).outputs == {"success": True}


def test_it_compares_json_as_json():
    assert run({"b": 2, "a": 1}, '{"a": 1, "b": 2}').outputs == {"success": True}
    assert run('{"a": 1}', '{"a": 2}').outputs == {"success": False}


def test_it_does_not_take_true_for_one():
    assert run({"a": True}, {"a": 1}).outputs == {"success": False}


def test_it_reads_another_ground_truth_column():
    result = evaluation_invoke(
        kind="exact_match",
        parameters={"correct_answer_key": "capital"},
        inputs={"capital": "Paris"},
        outputs="Paris",
    )
    assert result.outputs == {"success": True}


def test_it_fails_when_the_ground_truth_column_is_missing():
    result = evaluation_invoke(
        kind="exact_match", parameters={}, inputs={"country": "France"}, outputs="Paris"
    )
    assert result.status == "error"
    assert result.error["code"] == "missing_ground_truth"
    assert "country" in result.error["message"]


def test_it_refuses_unknown_settings():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("exact_match"), {"ignore_case": True})
    assert caught.value.fields == {"parameters.ignore_case": ["unknown setting for this kind"]}


def test_it_has_valid_presets():
    kind = get_kind("exact_match")
    assert {p.slug for p in kind.presets} == {"case_insensitive", "strict"}
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
