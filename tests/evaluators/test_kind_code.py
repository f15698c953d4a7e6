"""The code kind through the real sandbox: interfaces, runtimes, normalisation, save-time checks,
example cases, and every file in examples/evaluators/."""

from pathlib import Path

import pytest

from evalsite.errors import InvalidInput
from evaluators.models import EvaluatorRevision
from evaluators.samples import SAMPLE_TRACE
from evaluators.services import evaluation_invoke, evaluator_create

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "evaluators"

V2 = {
    "python": "def evaluate(inputs, outputs, trace):\n    return {RET}\n",
    "javascript": "function evaluate(inputs, outputs, trace) {\n  return {RET};\n}\nmodule.exports = { evaluate };\n",
    "typescript": "export function evaluate(inputs: any, outputs: any, trace: any): any {\n  return {RET};\n}\n",
}
V1 = {
    "python": "def evaluate(app_params, inputs, output, correct_answer):\n    return output == correct_answer\n",
    "javascript": "function evaluate(app_params, inputs, output, correct_answer) {\n  return output === correct_answer;\n}\n",
    "typescript": "function evaluate(app_params: any, inputs: any, output: any, correct_answer: any): boolean {\n  return output === correct_answer;\n}\n",
}
RUNTIMES = ["python", "javascript", "typescript"]


def run(runtime, code, version="2", inputs=None, outputs="Paris", trace=None, **extra):
    parameters = {
        "runtime": runtime,
        "code": code,
        **({"version": version} if version else {}),
        **extra,
    }
    return evaluation_invoke(
        kind="code",
        parameters=parameters,
        inputs=inputs or {"correct_answer": "Paris"},
        outputs=outputs,
        trace=trace,
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_runs_interface_v2(runtime):
    code = V2[runtime].replace(
        "{RET}",
        "outputs === inputs.correct_answer"
        if runtime != "python"
        else "outputs == inputs['correct_answer']",
    )
    assert run(runtime, code).outputs == {"success": True}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_runs_legacy_v1_when_no_version_is_stored(runtime):
    result = run(runtime, V1[runtime], version=None)
    assert result.status == "success", result.error
    assert result.outputs == {"success": True}


@pytest.mark.parametrize(
    ("python", "js", "expected"),
    [
        ("True", "true", {"success": True}),
        ("0.75", "0.75", {"score": 0.75, "success": True}),
        ("0", "0", {"score": 0, "success": False}),
        ("'0.4'", "'0.4'", {"score": 0.4, "success": False}),
        ("'fine'", "'fine'", {"output": "fine"}),
        (
            "{'score': 1, 'label': 'ok', 'nested': {'a': 2}}",
            "{score: 1, label: 'ok', nested: {a: 2}}",
            {"score": 1, "label": "ok", "nested": {"a": 2}},
        ),
    ],
)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_normalises_the_same_in_every_runtime(runtime, python, js, expected):
    code = V2[runtime].replace("{RET}", python if runtime == "python" else js)
    result = run(runtime, code)
    assert result.status == "success", result.error
    assert result.outputs == expected


@pytest.mark.parametrize(
    ("python", "js", "named"),
    [
        ("None", "null", "None"),
        ("float('nan')", "NaN", "NaN"),
        ("float('inf')", "Infinity", "Infinity"),
    ],
)
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_refuses_non_scores_the_same_in_every_runtime(runtime, python, js, named):
    result = run(runtime, V2[runtime].replace("{RET}", python if runtime == "python" else js))
    assert result.status == "error"
    assert result.error["code"] == "invalid_return"
    assert named in result.error["message"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_records_an_exception_with_its_stack_trace(runtime):
    throw = (
        "raise ValueError('bad input')" if runtime == "python" else "throw new Error('bad input')"
    )
    code = V2[runtime].replace("return {RET}", throw).replace("return {RET};", throw + ";")
    result = run(runtime, code)
    assert result.status == "error" and result.outputs is None
    assert "bad input" in result.error["message"]
    assert result.error["stacktrace"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_captures_printed_logs_apart_from_the_result(runtime):
    log = (
        "print('hello from user code')"
        if runtime == "python"
        else "console.log('hello from user code')"
    )
    code = V2[runtime].replace(
        "return {RET}", f"{log}\n    return True" if runtime == "python" else f"{log}; return true"
    )
    result = run(runtime, code)
    assert result.outputs == {"success": True}
    assert "hello from user code" in result.logs


def test_it_runs_every_example_file_on_the_sample_trace():
    cases = {
        "exact_match.py": ("python", "2", {"score": 1.0, "success": True}),
        "exact_match.js": ("javascript", "2", {"score": 1, "success": True}),
        "exact_match.ts": ("typescript", "2", {"score": 1, "success": True}),
        "trace_latency_check.py": ("python", "2", {"latency_ms": 1234.5, "success": True}),
        "trace_token_budget.py": ("python", "2", {"tokens": 51, "success": True}),
        "json_validity.py": ("python", "2", {"success": False}),
        "multi_metric.py": (
            "python",
            "2",
            {"score": 1.0, "success": True, "label": "exact", "length": 5},
        ),
        "legacy_v1_exact_match.py": ("python", "1", {"score": 1.0, "success": True}),
    }
    assert set(cases) == {p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".js", ".ts")}
    for name, (runtime, version, expected) in cases.items():
        result = run(runtime, (EXAMPLES / name).read_text(), version=version, trace=SAMPLE_TRACE)
        assert result.status == "success", (name, result.error)
        assert result.outputs == expected, name


def test_it_refuses_to_save_code_with_a_syntax_error_naming_the_line(project):
    code = "def evaluate(inputs, outputs, trace):\n    return (1 +\n"
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(project=project, kind="code", name="Broken", parameters={"code": code})
    assert "line" in caught.value.fields["parameters.code"][0]
    assert not project.evaluators.exists()


def test_it_refuses_code_without_an_evaluate_function(project):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project,
            kind="code",
            name="Empty",
            parameters={"runtime": "javascript", "code": "const x = 1;"},
        )
    assert "evaluate" in caught.value.fields["parameters.code"][0]


@pytest.mark.parametrize("early", ["return;", "return null;", "if (true) return 5;"])
def test_a_javascript_module_that_returns_early_keeps_its_exports(project, early):
    code = "function evaluate(inputs, outputs, trace) { return outputs === 'Paris'; }\n"
    code += f"module.exports = {{ evaluate }};\n{early}\n"
    assert run("javascript", code).outputs == {"success": True}
    evaluator = evaluator_create(
        project=project,
        kind="code",
        name="Early",
        parameters={"runtime": "javascript", "code": code},
    )
    assert evaluator.head.parameters["code"] == code


def test_a_javascript_module_that_returns_before_exporting_has_no_evaluate(project):
    code = "return;\nfunction evaluate(inputs, outputs, trace) { return true; }\n"
    result = run("javascript", code)
    assert result.status == "error"
    assert result.error["type"] == "MissingEvaluate"
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project,
            kind="code",
            name="Early",
            parameters={"runtime": "javascript", "code": code},
        )
    assert "evaluate" in caught.value.fields["parameters.code"][0]


SESSION_ONLY = {
    "python": "def evaluate_session(inputs, outputs, session):\n    return 1\n",
    "javascript": "function evaluateSession(inputs, outputs, session) { return 1; }\n",
    "typescript": "export function evaluateSession(inputs: any, outputs: any, s: any) {\n"
    "  return 1;\n}\n",
}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_refuses_a_version_1_evaluator_without_evaluate(project, runtime):
    with pytest.raises(InvalidInput) as caught:
        evaluator_create(
            project=project,
            kind="code",
            name="Sessions on v1",
            parameters={"runtime": runtime, "code": SESSION_ONLY[runtime], "version": "1"},
        )
    message = caught.value.fields["parameters.code"][0]
    assert "Interface version 1 calls evaluate(" in message
    assert "interface version 2" in message
    assert not project.evaluators.exists()
    # The same code on version 2 is a session-only evaluator.
    evaluator_create(
        project=project,
        kind="code",
        name="Sessions on v2",
        parameters={"runtime": runtime, "code": SESSION_ONLY[runtime], "version": "2"},
    )


def test_it_starts_new_evaluators_on_interface_v2(api):
    response = api.post("/api/v1/evaluators", {"name": "Mine", "kind": "code"}, format="json")
    assert response.status_code == 201
    assert response.json()["head"]["parameters"]["version"] == "2"
    assert response.json()["head"]["parameters"]["runtime"] == "python"


def test_it_reads_a_stored_revision_without_version_as_v1(project):
    evaluator = evaluator_create(
        project=project, kind="code", name="Old", parameters={"code": V1["python"]}
    )
    legacy = evaluator.head.parameters | {}
    legacy.pop("version")
    EvaluatorRevision.objects.filter(pk=evaluator.head.pk).update(parameters=legacy)
    evaluator.head.refresh_from_db()
    result = evaluation_invoke(
        revision=evaluator.head, inputs={"correct_answer": "Paris"}, outputs="Paris"
    )
    assert result.outputs == {"success": True}


def test_it_runs_example_cases_when_saving(project):
    examples = [
        {
            "name": "right",
            "inputs": {"correct_answer": "Paris"},
            "outputs": "Paris",
            "expected": {"success": True},
        },
        {
            "name": "wrong",
            "inputs": {"correct_answer": "Paris"},
            "outputs": "Lyon",
            "expected": {"success": True},
        },
    ]
    evaluator = evaluator_create(project=project, kind="code", name="Checked", examples=examples)
    report = {case["name"]: case for case in evaluator.head.examples_report}
    assert report["right"]["passed"] is True
    assert report["wrong"]["passed"] is False
    assert "success False, expected True" in report["wrong"]["problems"][0]
