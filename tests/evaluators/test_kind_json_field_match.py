import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate

TRUTH = {
    "name": "Ada Lovelace",
    "age": 36,
    "address": {"city": "London", "lines": ["12 St James's Square"]},
    "tags": ["math", "poetry"],
}


def run(outputs, inputs=None, **parameters):
    inputs = {"correct_answer": TRUTH} if inputs is None else inputs
    return evaluation_invoke(
        kind="json_field_match", parameters=parameters, inputs=inputs, outputs=outputs
    )


def refused(**parameters) -> dict:
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("json_field_match"), parameters)
    return caught.value.fields


def test_it_scores_each_field_and_the_share_that_matched():
    result = run(TRUTH, fields=["name", "address.city", "age"])
    assert result.status == "success"
    assert result.outputs == {
        "name": 1,
        "address_city": 1,
        "age": 1,
        "score": 1.0,
        "success": True,
    }


def test_it_reads_dot_paths_jsonpath_and_json_pointer():
    fields = ["address.lines[0]", "$.address.city", "/tags/1", "tags.0"]
    result = run(TRUTH, fields=fields)
    assert result.outputs == {
        "address_lines_0": 1,
        "address_city": 1,
        "tags_1": 1,
        "tags_0": 1,
        "score": 1.0,
        "success": True,
    }


def test_it_parses_an_output_that_is_a_json_string():
    result = run('{"name": "Ada Lovelace", "age": 36}', fields=["name", "age"])
    assert result.outputs["score"] == 1.0


def test_it_reports_a_partial_match():
    output = {**TRUTH, "age": 37}
    result = run(output, fields=["name", "age"])
    assert result.outputs == {"name": 1, "age": 0, "score": 0.5, "success": False}


def test_it_succeeds_at_the_threshold():
    output = {**TRUTH, "age": 37}
    assert run(output, fields=["name", "age"], threshold=0.5).outputs["success"] is True


def test_it_counts_a_field_missing_from_the_output_as_a_mismatch():
    result = run({"name": "Ada Lovelace"}, fields=["name", "address.city"])
    assert result.outputs == {"name": 1, "address_city": 0, "score": 0.5, "success": False}


def test_it_scores_zero_when_the_output_is_not_json():
    result = run("Her name was Ada.", fields=["name", "age"])
    assert result.status == "success"
    assert result.outputs == {"name": 0, "age": 0, "score": 0.0, "success": False}


def test_it_reads_a_ground_truth_column_that_holds_a_json_string():
    inputs = {"expected": '{"name": "Ada Lovelace"}'}
    result = run(TRUTH, inputs=inputs, fields=["name"], correct_answer_key="expected")
    assert result.outputs["success"] is True


def test_it_reads_expected_values_from_per_field_columns():
    inputs = {"expected_age": "36", "expected_city": "London"}
    result = run(
        TRUTH,
        inputs=inputs,
        fields=["age", "address.city"],
        field_columns={"age": "expected_age", "address.city": "expected_city"},
    )
    assert result.outputs == {"age": 1, "address_city": 1, "score": 1.0, "success": True}


def test_it_mixes_per_field_columns_and_the_json_column():
    inputs = {"correct_answer": TRUTH, "expected_age": 36}
    result = run(
        TRUTH, inputs=inputs, fields=["name", "age"], field_columns={"age": "expected_age"}
    )
    assert result.outputs["score"] == 1.0


def test_it_does_not_take_true_for_one():
    inputs = {"correct_answer": {"flag": 1}}
    assert run({"flag": True}, inputs=inputs, fields=["flag"]).outputs["flag"] == 0


def test_it_compares_whole_objects_and_lists_as_json():
    assert run(TRUTH, fields=["address"]).outputs["address"] == 1
    assert run({**TRUTH, "tags": ["poetry", "math"]}, fields=["tags"]).outputs["tags"] == 0


def test_it_can_ignore_case():
    output = {"name": "ADA LOVELACE "}
    assert run(output, fields=["name"]).outputs["name"] == 0
    assert run(output, fields=["name"], case_sensitive=False).outputs["name"] == 1


def test_it_names_metrics_safely_and_uniquely():
    inputs = {"correct_answer": {"score": 3, "a": {"b": 1}, "a_b": 2}}
    output = {"score": 3, "a": {"b": 1}, "a_b": 2}
    result = run(output, inputs=inputs, fields=["$.score", "a.b", "a_b"])
    assert result.status == "success"
    assert result.outputs == {"score_2": 1, "a_b": 1, "a_b_2": 1, "score": 1.0, "success": True}


def test_it_computes_the_outputs_schema_from_the_fields():
    kind = get_kind("json_field_match")
    schema = kind.outputs_schema(parameters_validate(kind, {"fields": ["a.b", "c"]}))
    assert schema["required"] == ["a_b", "c", "score", "success"]
    assert schema["properties"]["a_b"] == {"type": "integer", "minimum": 0, "maximum": 1}


def test_it_fails_when_the_ground_truth_lacks_a_field():
    result = run(TRUTH, fields=["name", "email"])
    assert result.status == "error"
    assert result.error["code"] == "missing_ground_truth"
    assert "'email'" in result.error["message"]


def test_it_fails_when_the_ground_truth_column_is_missing():
    result = run(TRUTH, inputs={"question": "Who?"}, fields=["name"])
    assert result.status == "error"
    assert result.error["code"] == "missing_ground_truth"
    assert "question" in result.error["message"]


def test_it_fails_when_a_field_column_is_missing():
    result = run(TRUTH, inputs={}, fields=["age"], field_columns={"age": "expected_age"})
    assert result.error["code"] == "missing_ground_truth"
    assert "'expected_age'" in result.error["message"]


def test_it_fails_when_the_ground_truth_is_not_json():
    result = run(TRUTH, inputs={"correct_answer": "Ada"}, fields=["name"])
    assert result.status == "error"
    assert result.error["code"] == "invalid_ground_truth"


def test_it_refuses_a_bad_path():
    fields = refused(fields=["name", "a..b"])
    assert "'a..b' is not a valid field path" in fields["parameters.fields"][0]


def test_it_refuses_bad_jsonpath_and_pointer_syntax():
    assert "JSONPath" in refused(fields=["$..["])["parameters.fields"][0]
    assert "JSON Pointer" in refused(fields=["/a~2"])["parameters.fields"][0]


def test_it_refuses_no_fields_and_repeated_fields():
    assert "parameters.fields" in refused(fields=[])
    assert "only once" in refused(fields=["a", "a"])["parameters.fields"][0]
    assert refused()["parameters.fields"] == ["Field required"]


def test_it_refuses_columns_for_unknown_fields():
    fields = refused(fields=["age"], field_columns={"name": "expected_name"})
    assert fields == {"parameters.field_columns": ["names paths that are not in fields: name"]}


def test_it_refuses_a_threshold_above_one():
    assert "parameters.threshold" in refused(fields=["a"], threshold=2)


def test_it_has_valid_presets():
    kind = get_kind("json_field_match")
    for preset in kind.presets:
        parameters_validate(kind, preset.parameters)
