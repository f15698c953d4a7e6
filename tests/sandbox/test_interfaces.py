"""Both evaluator interfaces in every runtime, the shapes of returned values, captured output."""

from __future__ import annotations

import pytest

from evaluators.normalize import EvaluationError, Unrepresentable, normalize
from evaluators.sandbox import CallResult, check_code

from .conftest import call, error_code, one, run

V2 = {
    "python": """
        def evaluate(inputs, outputs, trace):
            root = next(iter(trace["spans"].values())) if trace else None
            latency = root["attributes"]["ag"]["metrics"]["unit"]["duration"]["total"] if root else None
            return {"match": outputs == inputs["correct_answer"], "latency": latency}
    """,
    "javascript": """
        function evaluate(inputs, outputs, trace) {
          const root = trace ? Object.values(trace.spans)[0] : null;
          const latency = root ? root.attributes.ag.metrics.unit.duration.total : null;
          return { match: outputs === inputs.correct_answer, latency };
        }
        module.exports = { evaluate };
    """,
    "typescript": """
        type Inputs = { correct_answer: string; [key: string]: unknown };
        export function evaluate(inputs: Inputs, outputs: string, trace: any): Record<string, unknown> {
          const root: any = trace ? Object.values(trace.spans)[0] : null;
          const latency: number | null = root ? root.attributes.ag.metrics.unit.duration.total : null;
          return { match: outputs === inputs.correct_answer, latency };
        }
    """,
}

V1 = {
    "python": """
        def evaluate(app_params, inputs, output, correct_answer):
            return 1.0 if output == correct_answer and app_params["strict"] else 0.0
    """,
    "javascript": """
        function evaluate(app_params, inputs, output, correct_answer) {
          return output === correct_answer && app_params.strict ? 1.0 : 0.0;
        }
    """,
    "typescript": """
        export default function evaluate(app_params: {strict: boolean}, inputs: object,
                                         output: string, correct_answer: string): number {
          return output === correct_answer && app_params.strict ? 1.0 : 0.0;
        }
    """,
}

TRACE = {
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "spans": {
        "root": {
            "span_id": "root",
            "parent_id": None,
            "name": "rag",
            "attributes": {"ag": {"metrics": {"unit": {"duration": {"total": 1234.5}}}}},
            "children": {},
        }
    },
}

RUNTIMES = ["python", "javascript", "typescript"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_runs_the_v2_interface(config, runtime):
    calls = [
        call({"country": "France", "correct_answer": "Paris"}, "Paris", TRACE),
        call({"country": "Spain", "correct_answer": "Madrid"}, "Paris", None),
    ]
    results = run(config, runtime, V2[runtime], calls)
    assert [r.status for r in results] == ["success", "success"]
    assert results[0].value == {"match": True, "latency": 1234.5}
    assert results[1].value == {"match": False, "latency": None}
    assert results[0].duration_ms >= 0


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_runs_the_legacy_v1_interface(config, runtime):
    calls = [
        call({"q": 1}, "Paris", app_params={"strict": True}, correct_answer="Paris"),
        call({"q": 2}, "Lyon", app_params={"strict": True}, correct_answer="Paris"),
    ]
    results = run(config, runtime, V1[runtime], calls, version="1")
    assert [r.value for r in results] == [1.0, 0.0]


def test_it_awaits_async_javascript(config):
    code = """
        module.exports.evaluate = async (inputs, outputs) => {
          await new Promise((resolve) => setTimeout(resolve, 5));
          return outputs.length;
        };
    """
    results = run(config, "javascript", code, [call(outputs="abc"), call(outputs="abcdef")])
    assert [r.value for r in results] == [3, 6]
    assert results[0].duration_ms >= 4


def test_it_awaits_async_typescript_and_reports_rejections(config):
    code = """
        export async function evaluate(inputs: {n: number}): Promise<number> {
          if (inputs.n < 0) throw new RangeError("negative");
          return inputs.n * 2;
        }
    """
    results = run(config, "typescript", code, [call({"n": 2}), call({"n": -1})])
    assert results[0].value == 4
    assert results[1].error["type"] == "RangeError"
    assert results[1].error["message"] == "negative"


@pytest.mark.parametrize(
    "code",
    [
        "function evaluate() { return 'plain'; }",
        "export function evaluate() { return 'plain'; }",
        "module.exports = { evaluate: () => 'plain' };",
        "exports.evaluate = function () { return 'plain'; };",
        "module.exports = function evaluate() { return 'plain'; };",
    ],
)
def test_it_finds_evaluate_however_javascript_exports_it(config, code):
    assert one(config, "javascript", code).value == "plain"


SHAPES = {
    "python": [
        ("True", True),
        ("0.75", 0.75),
        ("3", 3),
        ("'0.9'", "0.9"),
        (
            "{'score': 1, 'nested': {'ok': [1, 'two', None]}}",
            {"score": 1, "nested": {"ok": [1, "two", None]}},
        ),
        ("None", None),
        ("float('nan')", Unrepresentable("NaN")),
        ("float('-inf')", Unrepresentable("-Infinity")),
        ("{1, 2}", Unrepresentable("a set")),
        ("{'score': float('nan')}", Unrepresentable("a dict containing NaN at score")),
        (
            "{'a': {'b': [1, float('inf')]}}",
            Unrepresentable("a dict containing Infinity at a.b[1]"),
        ),
        ("{1: 'x'}", Unrepresentable("a dict containing a non-string key 1")),
        ("object()", Unrepresentable("an object")),
        ("b'bytes'", Unrepresentable("a bytes")),
    ],
    "javascript": [
        ("true", True),
        ("0.75", 0.75),
        ("'0.9'", "0.9"),
        (
            "{score: 1, nested: {ok: [1, 'two', null]}}",
            {"score": 1, "nested": {"ok": [1, "two", None]}},
        ),
        ("null", None),
        ("undefined", Unrepresentable("undefined")),
        ("NaN", Unrepresentable("NaN")),
        ("-Infinity", Unrepresentable("-Infinity")),
        ("new Set([1])", Unrepresentable("a Set")),
        ("10n", Unrepresentable("a BigInt")),
        ("() => 1", Unrepresentable("a function")),
        ("{score: NaN}", Unrepresentable("an object containing NaN at score")),
        ("{score: undefined}", Unrepresentable("an object containing undefined at score")),
        ("{a: {b: [1, Infinity]}}", Unrepresentable("an object containing Infinity at a.b[1]")),
        ("new Date(0)", "1970-01-01T00:00:00.000Z"),
    ],
}


@pytest.mark.parametrize(
    ("runtime", "expression", "expected"),
    [(runtime, expr, value) for runtime, cases in SHAPES.items() for expr, value in cases],
)
def test_it_reports_each_return_value_shape_raw(config, runtime, expression, expected):
    if runtime == "python":
        code = f"def evaluate(inputs, outputs, trace):\n    return {expression}\n"
    else:
        code = f"function evaluate() {{ return ({expression}); }}"
    result = one(config, runtime, code)
    assert result.status == "success", result
    assert result.value == expected
    assert type(result.value) is type(expected)


def test_it_leaves_normalisation_to_the_caller(config):
    result = one(config, "javascript", "function evaluate() { return NaN; }")
    with pytest.raises(EvaluationError, match="returned NaN"):
        normalize(result.value)
    ok = one(config, "python", "def evaluate(i, o, t):\n    return 0.8\n")
    assert normalize(ok.value) == {"score": 0.8, "success": True}


@pytest.mark.parametrize(
    ("runtime", "code", "line"),
    [
        ("python", "def evaluate(inputs, outputs, trace):\n    x = 1\n    return x / 0\n", 3),
        ("javascript", "function evaluate() {\n  const a = null;\n  return a.b;\n}", 3),
        (
            "typescript",
            "function evaluate(): number {\n  const a: any = null;\n  return a.b;\n}",
            3,
        ),
    ],
)
def test_it_reports_exceptions_with_the_users_line_numbers(config, runtime, code, line):
    result = one(config, runtime, code)
    assert error_code(result) == "exception"
    assert result.error["type"] in {"ZeroDivisionError", "TypeError"}
    stack = result.error["stacktrace"]
    assert f"line {line}" in stack or f":{line}:" in stack
    assert "worker.py" not in stack and "worker.js" not in stack


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_it_captures_printed_output_per_call(config, runtime):
    code = {
        "python": "def evaluate(inputs, outputs, trace):\n    print('seen', inputs['n'])\n    return 1\n",
        "javascript": "function evaluate(inputs) { console.log('seen', inputs.n); return 1; }",
        "typescript": "function evaluate(inputs: {n: number}) { console.error('seen', inputs.n); return 1; }",
    }[runtime]
    results = run(config, runtime, code, [call({"n": 1}), call({"n": 2})])
    assert [r.logs for r in results] == ["seen 1\n", "seen 2\n"]
    assert [r.value for r in results] == [1, 1]


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        (
            "python",
            "def evaluate(i, o, t):\n    for n in range(100000):\n        print('flood', n)\n    return 'done'\n",
        ),
        (
            "javascript",
            "function evaluate() { for (let n = 0; n < 100000; n++) console.log('flood', n); return 'done'; }",
        ),
        (
            "javascript",
            "function evaluate() { for (let n = 0; n < 100000; n++) process.stdout.write('flood'); return 'done'; }",
        ),
    ],
)
def test_it_bounds_captured_output_and_never_mixes_it_with_results(config, runtime, code):
    result = one(config, runtime, code)
    assert result.value == "done"
    assert result.logs.startswith("flood")
    assert "[output truncated after 2000 characters]" in result.logs
    assert len(result.logs) < 2100


@pytest.mark.parametrize(
    ("runtime", "code", "line"),
    [
        ("python", "def evaluate(inputs, outputs, trace):\n    return (\n", 2),
        ("javascript", "function evaluate() {\n  return 1 +;\n}", 2),
        ("typescript", "function evaluate(): number {\n  let x: = 1;\n}", 2),
    ],
)
def test_it_checks_code_and_reports_the_syntax_error_line(runtime, code, line):
    problems = check_code(runtime=runtime, code=code)
    assert len(problems) == 1
    assert problems[0]["code"] == "compile_error"
    assert problems[0]["line"] == line


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        ("python", "def evaluate(inputs, outputs, trace):\n    return True\n"),
        ("javascript", "export const evaluate = () => true;"),
        ("typescript", "export function evaluate(): boolean { return true; }"),
    ],
)
def test_it_checks_valid_code_without_problems(runtime, code):
    assert check_code(runtime=runtime, code=code) == []


@pytest.mark.parametrize(
    ("runtime", "code"), [("python", "x = 1\n"), ("javascript", "const x = 1;")]
)
def test_it_reports_a_missing_evaluate_function(runtime, code):
    problems = check_code(runtime=runtime, code=code)
    assert [p["type"] for p in problems] == ["MissingEvaluate"]


def test_it_fails_every_call_of_a_batch_whose_code_does_not_load(config):
    results = run(
        config,
        "python",
        "import nonexistent_module\ndef evaluate(i, o, t):\n    return 1\n",
        [call(), call()],
    )
    assert [error_code(r) for r in results] == ["compile_error", "compile_error"]
    assert results[0].error["type"] == "ModuleNotFoundError"
    assert isinstance(results[0], CallResult)


def test_it_rejects_arguments_that_are_not_json_without_running_them(config):
    results = run(
        config,
        "python",
        "def evaluate(i, o, t):\n    return 1\n",
        [call({"x": float("nan")}), call({"x": 1})],
    )
    assert error_code(results[0]) == "invalid_input"
    assert results[1].value == 1


def test_it_runs_async_python_too(config):
    code = """
        import asyncio
        async def evaluate(inputs, outputs, trace):
            await asyncio.sleep(0.001)
            return len(outputs)
    """
    assert one(config, "python", code, calls=[call(outputs="abcd")]).value == 4


def test_it_returns_nothing_for_an_empty_batch(config):
    assert run(config, "python", "def evaluate(i, o, t):\n    return 1\n", []) == []


def test_it_lets_python_evaluators_use_dataclasses_and_future_annotations(config):
    code = """
        from __future__ import annotations
        from dataclasses import dataclass

        @dataclass
        class Verdict:
            score: float
            reason: str

        def evaluate(inputs, outputs, trace):
            return Verdict(1.0, "ok").__dict__
    """
    assert one(config, "python", code).value == {"score": 1.0, "reason": "ok"}


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        ("python", "x = 1\ny = {}['missing']\ndef evaluate(i, o, t):\n    return 1\n"),
        ("javascript", "const x = 1;\nconst y = null.missing;\nfunction evaluate() { return 1; }"),
    ],
)
def test_it_reports_the_line_where_top_level_code_failed(runtime, code):
    problems = check_code(runtime=runtime, code=code)
    assert [(p["code"], p["line"]) for p in problems] == [("compile_error", 2)]


def test_it_recompiles_when_a_revision_key_comes_back_with_other_code(config):
    first = run(config, "python", "def evaluate(i, o, t):\n    return 'old'\n", revision_key="same")
    second = run(
        config, "python", "def evaluate(i, o, t):\n    return 'new'\n", revision_key="same"
    )
    assert [first[0].value, second[0].value] == ["old", "new"]
