import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate

TRUTH = {"name": "Ada", "born": {"year": 1815, "city": "London"}, "tags": ["math"]}


def run(outputs, truth=TRUTH, **parameters):
    return evaluation_invoke(
        kind="json_diff", parameters=parameters, inputs={"correct_answer": truth}, outputs=outputs
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("json_diff"), parameters)
    return caught.value.fields


def test_it_scores_identical_json_one():
    result = run(TRUTH)
    assert result.status == "success"
    assert result.outputs == {"score": 1.0, "success": True}


def test_it_scores_the_share_of_matching_leaf_keys():
    output = {"name": "Ada", "born": {"year": 1815, "city": "Paris"}, "tags": ["math"]}
    assert run(output).outputs == {"score": 0.75, "success": True}


def test_it_counts_missing_keys_as_mismatches():
    assert run({"name": "Ada"}).outputs == {"score": 0.25, "success": False}


def test_it_ignores_extra_keys_unless_asked():
    output = {**TRUTH, "died": 1852}
    assert run(output).outputs["score"] == 1.0
    assert run(output, penalize_extra_keys=True).outputs["score"] == 0.8


def test_it_compares_lists_whole():
    assert run({**TRUTH, "tags": ["math", "poetry"]}).outputs["score"] == 0.75


def test_it_can_compare_types_only():
    output = {"name": "Grace", "born": {"year": 1906, "city": "New York"}, "tags": []}
    assert run(output).outputs["score"] == 0.0
    assert run(output, compare_schema_only=True).outputs == {"score": 1.0, "success": True}


def test_it_tells_types_apart_when_comparing_types():
    output = {"name": "Ada", "born": {"year": "1815", "city": None}, "tags": "math"}
    assert run(output, compare_schema_only=True).outputs["score"] == 0.25


def test_it_does_not_take_true_for_one():
    assert run({"a": True}, {"a": 1}).outputs["score"] == 0.0
    assert run({"a": 1.0}, {"a": 1}).outputs["score"] == 1.0


def test_it_can_ignore_the_case_of_keys():
    output = {"Name": "Ada", "BORN": {"Year": 1815, "City": "London"}, "Tags": ["math"]}
    assert run(output).outputs["score"] == 0.0
    assert run(output, case_insensitive_keys=True).outputs["score"] == 1.0


def test_it_parses_json_strings_on_both_sides():
    result = run('{"a": 1, "b": 2}', '{"a": 1, "b": 3}')
    assert result.outputs == {"score": 0.5, "success": True}


def test_it_applies_the_threshold():
    assert run({"name": "Ada"}, threshold=0.2).outputs["success"] is True
    assert run(TRUTH, threshold=1).outputs["success"] is True


def test_it_scores_zero_when_the_output_is_not_json():
    result = run("name: Ada")
    assert result.status == "success"
    assert result.outputs == {"score": 0.0, "success": False}


def test_it_scores_empty_objects_one():
    assert run({}, {}).outputs["score"] == 1.0


def test_it_fails_when_the_ground_truth_is_not_json():
    result = run(TRUTH, "Ada, born 1815")
    assert result.status == "error"
    assert result.error["code"] == "invalid_ground_truth"


def test_it_fails_when_the_ground_truth_column_is_missing():
    result = evaluation_invoke(kind="json_diff", parameters={}, inputs={}, outputs=TRUTH)
    assert result.error["code"] == "missing_ground_truth"


def test_it_accepts_an_integer_threshold_and_refuses_one_out_of_range():
    parameters_validate(get_kind("json_diff"), {"threshold": 1})
    assert "parameters.threshold" in refused(threshold=-1)


def test_it_has_valid_presets():
    kind = get_kind("json_diff")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
