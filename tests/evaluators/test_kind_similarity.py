import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def run(outputs, truth, **parameters):
    return evaluation_invoke(
        kind="similarity", parameters=parameters, inputs={"correct_answer": truth}, outputs=outputs
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("similarity"), parameters)
    return caught.value.fields


def test_it_scores_identical_text_one():
    result = run("Paris", "Paris")
    assert result.status == "success"
    assert result.outputs == {"score": 1.0, "success": True}


def test_it_computes_the_indel_similarity_by_default():
    # LCS("kitten", "sitting") = "ittn": 2 * 4 / (6 + 7)
    result = run("kitten", "sitting")
    assert result.outputs["score"] == pytest.approx(8 / 13)


def test_it_computes_the_levenshtein_similarity():
    # distance 3 over the longer length 7
    result = run("kitten", "sitting", method="levenshtein")
    assert result.outputs["score"] == pytest.approx(1 - 3 / 7)


def test_it_tells_the_two_methods_apart_when_lengths_differ():
    # Indel: 1 - 3 edits / (3 + 6) characters; Levenshtein: 1 - 3 edits / 6 (the longer text).
    assert run("abc", "abcdef").outputs["score"] == pytest.approx(2 / 3)
    assert run("abc", "abcdef", method="levenshtein").outputs["score"] == pytest.approx(0.5)


def test_it_applies_the_threshold():
    assert run("kitten", "sitting", threshold=0.6).outputs["success"] is True
    assert run("kitten", "sitting", threshold=0.7).outputs["success"] is False


def test_it_accepts_an_integer_threshold():
    assert run("Paris", "Paris", threshold=1).outputs["success"] is True
    assert run("Paris", "Pariss", threshold=1).outputs["success"] is False


def test_it_normalises_white_space_unless_told_not_to():
    assert run("  the   capital\nis Paris ", "the capital is Paris").outputs["score"] == 1.0
    result = run("  the   capital\nis Paris ", "the capital is Paris", normalize_whitespace=False)
    assert result.outputs["score"] < 1.0


def test_it_can_ignore_case():
    assert run("PARIS", "paris").outputs["score"] == 0.0
    assert run("PARIS", "paris", case_sensitive=False).outputs["score"] == 1.0


def test_it_compares_json_values_as_text():
    assert run({"b": 2, "a": 1}, '{"a": 1, "b": 2}').outputs["score"] == 1.0
    assert run(42, "42").outputs["score"] == 1.0


def test_it_scores_two_empty_texts_one():
    assert run("", "").outputs["score"] == 1.0


def test_it_fails_when_the_ground_truth_column_is_missing():
    result = evaluation_invoke(kind="similarity", parameters={}, inputs={"q": 1}, outputs="x")
    assert result.status == "error"
    assert result.error["code"] == "missing_ground_truth"


def test_it_refuses_an_unknown_method():
    assert "parameters.method" in refused(method="jaro_winkler")


def test_it_refuses_a_percentage_threshold():
    assert refused(threshold=80) == {
        "parameters.threshold": ["Input should be less than or equal to 1"]
    }


def test_it_has_valid_presets():
    kind = get_kind("similarity")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
