import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def run(outputs, truth, **parameters):
    return evaluation_invoke(
        kind="numeric_match",
        parameters=parameters,
        inputs={"correct_answer": truth},
        outputs=outputs,
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("numeric_match"), parameters)
    return caught.value.fields


def test_it_matches_the_same_number():
    result = run("42", 42)
    assert result.status == "success"
    assert result.outputs == {"success": True, "abs_error": 0.0}


def test_it_reads_numbers_and_numeric_strings_on_both_sides():
    assert run(3.5, "3.5").outputs["success"] is True
    assert run(" -1,234.5 ", "-1234.5").outputs["success"] is True
    assert run("6.02e23", 6.02e23).outputs["success"] is True


def test_it_fails_a_different_number_and_reports_the_error():
    assert run("41.5", 42).outputs == {"success": False, "abs_error": 0.5}


def test_it_allows_an_absolute_tolerance():
    assert run(41.5, 42, absolute_tolerance=0.5).outputs["success"] is True
    assert run(41.4, 42, absolute_tolerance=0.5).outputs["success"] is False


def test_it_allows_a_relative_tolerance_of_the_expected_value():
    assert run(104, 100, relative_tolerance=0.05).outputs["success"] is True
    assert run(106, 100, relative_tolerance=0.05).outputs["success"] is False


def test_it_passes_within_either_tolerance():
    parameters = {"absolute_tolerance": 0.01, "relative_tolerance": 0.1}
    assert run(0.005, 0, **parameters).outputs["success"] is True
    assert run(109, 100, **parameters).outputs["success"] is True
    assert run(111, 100, **parameters).outputs["success"] is False


def test_it_can_read_the_last_number_of_a_text():
    text = "There are 3 boxes of 4 apples, so the answer is 12."
    assert run(text, 12, extract_number=True).outputs["success"] is True
    assert run("Total: $1,234.50", 1234.5, extract_number=True).outputs["success"] is True


def test_it_fails_clearly_when_the_output_is_not_a_number():
    result = run("about twelve", 12)
    assert result.status == "error"
    assert result.error["code"] == "output_not_numeric"
    assert "'about twelve'" in result.error["message"]
    assert "extract_number" in result.error["message"]


def test_it_fails_when_no_number_can_be_extracted():
    result = run("no idea", 12, extract_number=True)
    assert result.error["code"] == "output_not_numeric"
    assert "extract_number" not in result.error["message"]


def test_it_does_not_read_a_boolean_or_nan_as_a_number():
    assert run(True, 1).error["code"] == "output_not_numeric"
    assert run(float("nan"), 1).error["code"] == "output_not_numeric"
    assert run("inf", 1).error["code"] == "output_not_numeric"


def test_it_fails_when_the_ground_truth_is_not_a_number():
    result = run("12", "twelve")
    assert result.status == "error"
    assert result.error["code"] == "invalid_ground_truth"
    assert "'twelve'" in result.error["message"]


def test_it_fails_when_the_ground_truth_column_is_missing():
    result = evaluation_invoke(kind="numeric_match", parameters={}, inputs={}, outputs="1")
    assert result.error["code"] == "missing_ground_truth"


def test_it_refuses_negative_tolerances():
    assert "parameters.absolute_tolerance" in refused(absolute_tolerance=-1)
    assert "parameters.relative_tolerance" in refused(relative_tolerance=-0.1)


def test_it_has_valid_presets():
    kind = get_kind("numeric_match")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
