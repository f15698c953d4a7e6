"""Judge prompt templates: every curly syntax, jinja2 in its sandbox, and their errors."""

import json

import pytest

from evalsite.errors import InvalidInput
from evaluators.judge.context import evaluation_context, template_variables
from evaluators.judge.templates import render, render_all
from evaluators.kinds import get_kind
from evaluators.normalize import EvaluationError
from evaluators.samples import SAMPLE_TRACE
from evaluators.services import evaluation_invoke, parameters_validate

INPUTS = {
    "country": "France",
    "correct_answer": "Paris",
    "tags": ["europe", "capital"],
    "meta": {"source": {"name": "atlas"}, "year": 2024},
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}


def variables(inputs=None, outputs="Paris", trace=None, key="correct_answer", parameters=None):
    return template_variables(
        inputs=INPUTS if inputs is None else inputs,
        outputs=outputs,
        trace=trace,
        correct_answer_key=key,
        parameters=parameters or {"model": "judge-1"},
    )


def curly(template, **kwargs):
    return render(template, variables(**kwargs))


def problem(template, fmt="curly", **kwargs) -> EvaluationError:
    with pytest.raises(EvaluationError) as caught:
        render(template, variables(**kwargs), format=fmt)
    return caught.value


# --- curly --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{inputs.country}}", "France"),
        ("{{ inputs.country }}", "France"),
        ("{{country}}", "France"),
        ("{{inputs.tags[1]}}", "capital"),
        ("{{inputs.tags.0}}", "europe"),
        ("{{inputs.tags[-1]}}", "capital"),
        ("{{inputs.meta.source.name}}", "atlas"),
        ("{{meta.year}}", "2024"),
        ("{{inputs.messages[0].content}}", "What is the capital of France?"),
        ("{{outputs}}", "Paris"),
        ("{{reference}} {{correct_answer}} {{ground_truth}}", "Paris Paris Paris"),
        ("{{$.inputs.country}}", "France"),
        ("{{$.country}}", "France"),
        ("{{$.inputs.tags[*]}}", '["europe", "capital"]'),
        ("{{$.inputs.meta..name}}", "atlas"),
        ("{{/inputs/country}}", "France"),
        ("{{/inputs/tags/1}}", "capital"),
        ("{{/meta/source/name}}", "atlas"),
        ("{{parameters.model}}", "judge-1"),
        (
            "\\{{inputs.country}} is written {{inputs.country}}",
            "{{inputs.country}} is written France",
        ),
        ("no variables {at all}", "no variables {at all}"),
    ],
)
def test_curly_resolves_every_scheme(template, expected):
    assert curly(template) == expected


def test_curly_renders_whole_objects_as_json():
    assert json.loads(curly("{{inputs}}")) == INPUTS
    assert json.loads(curly("{{inputs.meta}}")) == INPUTS["meta"]
    assert json.loads(curly("{{parameters}}")) == {"model": "judge-1"}
    assert json.loads(curly("{{trace}}", trace=SAMPLE_TRACE)) == SAMPLE_TRACE
    assert curly("{{trace}}") == "null"


def test_curly_renders_non_strings_as_json():
    inputs = {"n": 3, "x": 0.5, "ok": True, "none": None, "text": "ünïcode"}
    assert curly("{{n}} {{x}} {{ok}} {{none}} {{text}}", inputs=inputs) == "3 0.5 true null ünïcode"
    assert json.loads(curly("{{outputs}}", outputs={"answer": "Paris"})) == {"answer": "Paris"}


def test_the_ground_truth_names_follow_correct_answer_key():
    inputs = {"question": "Capital?", "expected": "Paris"}
    assert curly("{{reference}}/{{ground_truth}}", inputs=inputs, key="expected") == "Paris/Paris"


def test_a_column_wins_over_a_context_field_and_core_names_win_over_columns():
    inputs = {"question": "from the column", "outputs": "a column named outputs"}
    assert curly("{{question}}", inputs=inputs) == "from the column"
    assert curly("{{outputs}} / {{inputs.outputs}}", inputs=inputs) == (
        "Paris / a column named outputs"
    )


def test_text_prompts_get_the_script_context_fields_too():
    text = "{{question}} | {{candidate_answer}} | {{reference_answer}} | {{input_messages[0].role}}"
    assert curly(text) == "What is the capital of France? | Paris | Paris | user"


def test_curly_lists_every_unresolved_name_once():
    error = problem(
        "{{inputs.city}} {{nope}} {{$.inputs.zip}} {{/inputs/x}} {{inputs.tags[5]}} {{nope}}"
    )
    assert error.code == "unresolved_variables"
    assert (
        "5 unresolved variables: inputs.city, nope, $.inputs.zip, /inputs/x, inputs.tags[5]."
        in (error.message)
    )


def test_unresolved_names_are_collected_across_all_messages():
    with pytest.raises(EvaluationError) as caught:
        render_all(["{{a}}", "fine", "{{b}} {{c}}"], variables())
    assert "a, b, c" in caught.value.message


def test_a_missing_reference_names_the_ground_truth_column():
    error = problem("{{reference}}", inputs={"country": "France"})
    assert "reference" in error.message and "correct_answer_key" in error.message


def test_a_malformed_jsonpath_is_a_template_error():
    error = problem("{{$.inputs[}}")
    assert error.code == "template_error"
    assert "not a valid JSONPath" in error.message


def test_an_empty_reference_is_unresolved():
    assert "(empty)" in problem("{{ }}").message


# --- jinja2 -------------------------------------------------------------------------------------


def jinja(template, **kwargs):
    return render(template, variables(**kwargs), format="jinja2")


def test_jinja2_reads_the_same_variables():
    template = (
        "{{ inputs.country }}/{{ country }}/{{ reference }}/{{ outputs }}/"
        "{% for tag in inputs.tags %}[{{ tag }}]{% endfor %}/{{ inputs.meta.source.name | upper }}"
    )
    assert jinja(template) == "France/France/Paris/Paris/[europe][capital]/ATLAS"


def test_jinja2_prints_objects_as_json():
    assert json.loads(jinja("{{ inputs }}")) == INPUTS
    assert jinja("{{ inputs.tags | tojson }}") == '["europe", "capital"]'
    assert jinja("{{ meta.year > 2000 }}") == "true"


def test_jinja2_may_test_an_undefined_reference():
    template = "{% if reference %}Reference: {{ reference }}{% else %}No reference{% endif %}"
    assert jinja(template) == "Reference: Paris"
    assert jinja(template, inputs={"country": "France"}) == "No reference"


def test_jinja2_lists_every_undefined_name_it_prints():
    error = problem("{{ nope }} {% for x in missing %}{% endfor %} {{ inputs.city }}", fmt="jinja2")
    assert error.code == "unresolved_variables"
    assert "nope, missing, city" in error.message


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.environ }}",
        "{{ inputs.__class__.__init__.__globals__ }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 100000000 }}",
        "{{ 10 ** 100000 }}",
    ],
)
def test_jinja2_runs_in_a_sandbox(template):
    error = problem(template, fmt="jinja2")
    assert error.code in ("template_error", "unresolved_variables")
    assert "environ" not in error.message.lower() or error.code == "unresolved_variables"


def test_jinja2_syntax_errors_are_refused_at_save_time():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(
            get_kind("llm_judge"),
            {
                "connection": "x",
                "template_format": "jinja2",
                "messages": [{"role": "user", "content": "{% if outputs %}no end"}],
            },
        )
    assert "jinja2 syntax error" in str(caught.value.fields)


def test_a_malformed_jsonpath_is_refused_at_save_time():
    with pytest.raises(InvalidInput) as caught:
        parameters_validate(
            get_kind("llm_judge"),
            {"connection": "x", "messages": [{"role": "user", "content": "{{$.[}}"}]},
        )
    assert "not a valid JSONPath" in str(caught.value.fields)


def test_unresolved_names_are_not_refused_at_save_time():
    parsed = parameters_validate(
        get_kind("llm_judge"),
        {"connection": "x", "messages": [{"role": "user", "content": "{{any_column}}"}]},
    )
    assert parsed.messages[0].content == "{{any_column}}"


# --- the evaluation context ---------------------------------------------------------------------


def test_the_context_has_every_field_of_the_contract():
    context = evaluation_context(
        inputs={**INPUTS, "expected_outcome": "names Paris", "guideline_files": ["g.md"]},
        outputs="Paris",
        trace=SAMPLE_TRACE,
        config={"strict": True},
    )
    assert context["question"] == "What is the capital of France?"
    assert context["candidate_answer"] == "Paris"
    assert context["reference_answer"] == "Paris"
    assert context["expected_outcome"] == "names Paris"
    assert context["expected_messages"] == []
    assert context["output_messages"] == [{"role": "assistant", "content": "Paris"}]
    assert context["guideline_files"] == ["g.md"]
    assert context["input_files"] == []
    assert context["input_messages"] == INPUTS["messages"]
    assert context["config"] == {"strict": True}
    summary = context["trace_summary"]
    assert summary["span_count"] == 3
    assert summary["duration_ms"] == 1234.5
    assert summary["token_usage"] == {"prompt": 42, "completion": 9, "total": 51}
    assert summary["cost_usd"] == 0.000039
    assert summary["error_count"] == 0


def test_the_context_reads_messages_from_outputs_and_the_trace():
    outputs = [
        {"role": "assistant", "content": "Let me check."},
        {"role": "assistant", "content": "Paris"},
    ]
    context = evaluation_context(inputs={}, outputs=outputs, trace=SAMPLE_TRACE)
    assert context["candidate_answer"] == "Paris"
    assert context["output_messages"] == outputs
    # no question column, no messages column: the root span's inputs hold no messages either,
    # so the question falls back to the (empty) row
    assert context["input_messages"] == [{"role": "user", "content": ""}]
    assert context["reference_answer"] is None
    assert context["trace_summary"]["tool_names"] == []


# --- through the kind ---------------------------------------------------------------------------


def test_a_jinja2_judge_sends_its_rendering(project, llm_connection, llm_server):
    messages = [
        {
            "role": "user",
            "content": "Country: {{ inputs.country }}{% if reference %}; truth: {{ reference }}{% endif %}"
            "; answer: {{ outputs }}",
        }
    ]
    result = evaluation_invoke(
        kind="llm_judge",
        parameters={
            "connection": "local",
            "template_format": "jinja2",
            "messages": messages,
            "format_instructions": False,
        },
        inputs={"country": "France"},
        outputs="Paris",
        project=project,
    )
    assert result.status == "success", result.error
    sent = llm_server.calls[0].json()["messages"]
    assert sent == [{"role": "user", "content": "Country: France; answer: Paris"}]


def test_the_render_api_shows_the_prompt_without_calling_the_model(api, llm_connection, llm_server):
    body = {
        "parameters": {
            "connection": "local",
            "format_instructions": False,
            "messages": [{"role": "user", "content": "{{inputs.country}} / {{$.outputs}}"}],
        },
        "inputs": {"country": "France"},
        "outputs": "Paris",
    }
    response = api.post("/api/v1/llm-judge/render", body, format="json")
    assert response.status_code == 200
    assert response.json() == {
        "messages": [{"role": "user", "content": "France / Paris"}],
        "error": None,
    }
    body["parameters"]["messages"][0]["content"] = "{{a}} {{b}}"
    error = api.post("/api/v1/llm-judge/render", body, format="json").json()["error"]
    assert error["code"] == "unresolved_variables" and "a, b" in error["message"]
    assert llm_server.calls == []


def test_viewers_may_not_render(viewer_api):
    # Rendering runs a template (or a judge script): editors only (docs/security.md, Roles).
    body = {"parameters": {"connection": "x"}, "inputs": {"question": "Q", "correct_answer": "A"}}
    response = viewer_api.post("/api/v1/llm-judge/render", body, format="json")
    assert response.status_code == 403
