import pytest

from evalsite.errors import InvalidInput
from evaluators.kinds import get_kind
from evaluators.services import evaluation_invoke, parameters_validate


def run(outputs, **parameters):
    return evaluation_invoke(kind="regex", parameters=parameters, inputs={}, outputs=outputs)


def test_it_succeeds_when_the_pattern_is_found():
    result = run("The capital is Paris.", pattern=r"\bParis\b")
    assert result.status == "success"
    assert result.outputs == {"success": True}


def test_it_fails_when_the_pattern_is_not_found():
    assert run("The capital is Lyon.", pattern="Paris").outputs == {"success": False}


def test_it_can_require_the_pattern_to_be_absent():
    assert run("Sorry, I can't.", pattern="(?i)sorry", should_match=False).outputs == {
        "success": False
    }


def test_it_can_ignore_case():
    assert run("PARIS", pattern="paris").outputs == {"success": False}
    assert run("PARIS", pattern="paris", case_sensitive=False).outputs == {"success": True}


def test_it_searches_json_outputs_as_text():
    assert run({"city": "Paris"}, pattern='"city": "Paris"').outputs == {"success": True}


def test_it_refuses_a_pattern_that_does_not_compile():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("regex"), {"pattern": "(unclosed"})
    [message] = caught.value.fields["parameters.pattern"]
    assert message.startswith("not a valid regular expression")


def test_it_requires_a_pattern():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(get_kind("regex"), {})
    assert caught.value.fields == {"parameters.pattern": ["Field required"]}


def test_it_has_presets_that_work():
    kind = get_kind("regex")
    presets = {p.slug: p.parameters for p in kind.presets}
    assert run("Answer: 42", **presets["starts_with"]).outputs == {"success": True}
    assert run("alpha then BETA", **presets["contains_all"]).outputs == {"success": True}
    assert run("beta only", **presets["contains_all"]).outputs == {"success": False}
    assert run("I apologise.", **presets["no_apology"]).outputs == {"success": False}


def test_it_stops_a_catastrophically_backtracking_pattern_as_an_error():
    from evaluators.services import evaluation_invoke

    result = evaluation_invoke(
        kind="regex",
        parameters={"pattern": "(a|aa)+$", "timeout_s": 0.2},
        inputs={},
        outputs="a" * 60 + "b",
    )
    assert result.status == "error"
    assert result.error["code"] == "regex_timeout"
    assert result.outputs is None
