"""Custom code: an ``evaluate`` function in Python, JavaScript or TypeScript, run in the sandbox.

Interface v2 (the default for new evaluators): ``evaluate(inputs, outputs, trace)``.
Interface v1 (legacy; what a stored revision without ``version`` means):
``evaluate(app_params, inputs, output, correct_answer)`` with
``correct_answer = inputs[correct_answer_key]``. Return values are normalised like every other
kind's. Evaluations of one batch go to a warm sandbox worker in one message (evaluators.sandbox).

Sessions (v2 only): ``evaluate_session(inputs, outputs, session)`` (``evaluateSession`` in
JavaScript and TypeScript) beside or instead of ``evaluate``. Whether code may judge sessions is
read from its text, so a session rule can be refused when it is made (``session_problem``): code
in which the name ``evaluate_session`` (or ``evaluateSession``, in JavaScript and TypeScript)
never occurs cannot define it, and is refused; any occurrence (a ``def``, an assignment, a tuple
assignment, an import, ``globals()["evaluate_session"] = ...``, even a comment) passes. Code that
names it without defining it when it runs fails each evaluation with ``session_unsupported``.
A version 1 module must define ``evaluate``; ``check`` refuses one that does not.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from evaluators import sandbox
from evaluators.kinds.base import (
    GroundTruthParameters,
    Kind,
    PresetSpec,
    register,
    ui,
)
from evaluators.normalize import EvaluationError, Raw

Runtime = Literal["python", "javascript", "typescript"]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "evaluators"


def _example(name: str) -> str:
    """Preset code lives in examples/evaluators/, where the tests run every file."""
    return (EXAMPLES / name).read_text()


PYTHON_DEFAULT = _example("exact_match.py")
JAVASCRIPT_DEFAULT = _example("exact_match.js")
TYPESCRIPT_DEFAULT = _example("exact_match.ts")


class Parameters(GroundTruthParameters):
    runtime: Runtime = Field("python", json_schema_extra=ui(widget="choice"))
    code: str = Field(
        PYTHON_DEFAULT, description="Defines evaluate().", json_schema_extra=ui(widget="code")
    )
    threshold: float = Field(
        0.5,
        description="A returned number x succeeds when x >= threshold (ints allowed).",
        json_schema_extra=ui(advanced=True),
    )
    timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="Wall-clock limit per evaluation.",
        json_schema_extra=ui(advanced=True),
    )
    version: Literal["1", "2"] | None = Field(
        None,
        description="Interface version: 2 is evaluate(inputs, outputs, trace); missing means 1.",
        json_schema_extra=ui(hidden=True),
    )


def _version(parameters: Parameters) -> str:
    return parameters.version or "1"


def _revision_key(parameters: Parameters) -> str:
    # Workers compile each key once; the key must change whenever the code or interface does.
    digest = hashlib.sha256(
        f"{parameters.runtime}\0{_version(parameters)}\0{parameters.code}".encode()
    )
    return digest.hexdigest()[:32]


def evaluate_many(parameters: Parameters, items: list[tuple], context: dict[str, Any]) -> list[Raw]:
    calls = [
        {
            "inputs": inputs,
            "outputs": outputs,
            "trace": trace,
            "app_params": {},
            "correct_answer": inputs.get(parameters.correct_answer_key),
        }
        for inputs, outputs, trace in items
    ]
    return _run(parameters, calls, [inputs for inputs, _, _ in items], context)


def _run(
    parameters: Parameters,
    calls: list[dict],
    inputs: list[dict],
    context: dict[str, Any],
    entry: str = "evaluate",
) -> list[Raw]:
    project = context.get("project")
    try:
        results = sandbox.run_batch(
            project_key=str(project.pk if project else "adhoc"),
            runtime=parameters.runtime,
            code=parameters.code,
            revision_key=_revision_key(parameters),
            version=_version(parameters),
            calls=calls,
            timeout_s=parameters.timeout_s,
            entry=entry,
        )
    except sandbox.SandboxUnavailable as exc:
        error = EvaluationError(str(exc), code="sandbox_unavailable")
        return [Raw(error=error) for _ in calls]
    return [_raw(result, parameters, row) for result, row in zip(results, inputs, strict=True)]


# Sessions of one sandbox batch, in bytes of JSON: the host holds a batch's encoded calls while
# it runs, and the celery runner ships it as one message. A larger session goes alone.
SESSION_BATCH_BYTES = 32 * 1024 * 1024
_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


def evaluate_sessions(
    parameters: Parameters, items: list[tuple], context: dict[str, Any]
) -> list[Raw]:
    """Each (inputs, outputs, session) to ``evaluate_session`` on a warm worker, in batches of
    at most ``SESSION_BATCH_BYTES`` of sessions."""
    raws: list[Raw] = []
    for batch in session_batches(items, SESSION_BATCH_BYTES):
        calls = [
            {"inputs": inputs, "outputs": outputs, "session": session}
            for inputs, outputs, session in batch
        ]
        inputs = [inputs for inputs, _, _ in batch]
        raws += _run(parameters, calls, inputs, context, entry="session")
    return raws


def session_batches(items: list[tuple], budget: int) -> Iterator[list[tuple]]:
    """``items`` in order, cut into runs whose sessions add up to at most ``budget`` bytes of
    JSON each (a session larger than that is a run of its own)."""
    batch: list[tuple] = []
    size = 0
    for item in items:
        item_size = len(_compact(item[2]).encode())
        if batch and size + item_size > budget:
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item_size
    if batch:
        yield batch


# The session entry point's name anywhere in the code (docstring above): code without it cannot
# define the entry point; code with it may.
_SESSION_ENTRY = {
    "python": re.compile(r"\bevaluate_session\b"),
    "javascript": re.compile(r"\b(?:evaluateSession|evaluate_session)\b"),
}
SESSION_HINT = {
    "python": "def evaluate_session(inputs, outputs, session)",
    "javascript": "function evaluateSession(inputs, outputs, session)",
    "typescript": "export function evaluateSession(inputs: any, outputs: any, session: any)",
}


def session_problem(parameters: Parameters) -> str | None:
    if _version(parameters) != "2":
        return (
            "Interface version 1 (evaluate(app_params, inputs, output, correct_answer)) cannot "
            "judge sessions: use interface version 2 and define "
            f"{SESSION_HINT[parameters.runtime]}."
        )
    family = "python" if parameters.runtime == "python" else "javascript"
    if not _SESSION_ENTRY[family].search(parameters.code):
        return (
            f"This code defines no session entry point, so it judges single traces only. To "
            f"judge sessions, define {SESSION_HINT[parameters.runtime]} (docs/code-evaluators.md, "
            f'"Judging a whole session").'
        )
    return None


def _raw(result, parameters: Parameters, inputs: dict) -> Raw:
    if result.status == "success":
        return Raw(value=result.value, duration_ms=result.duration_ms, logs=result.logs)
    error = dict(result.error or {})
    if (
        _version(parameters) == "1"
        and parameters.correct_answer_key not in inputs
        and error.get("code") == "evaluator_exception"
    ):
        error["message"] += (
            f" (v1 passes inputs[{parameters.correct_answer_key!r}], which is missing)"
        )
    exc = EvaluationError(
        error.get("message", "the evaluation failed"),
        code=error.get("code", "evaluator_exception"),
        type=error.get("type", ""),
        stacktrace=error.get("stacktrace", ""),
    )
    return Raw(error=exc, duration_ms=result.duration_ms, logs=result.logs)


def check(parameters: Parameters) -> dict[str, list[str]]:
    """Syntax and load errors, with line numbers, before anything is saved; a version 1 module
    without ``evaluate`` too (it could judge nothing: sessions need version 2)."""
    try:
        problems = sandbox.check_code(
            runtime=parameters.runtime, code=parameters.code, version=_version(parameters)
        )
    except sandbox.SandboxUnavailable as exc:
        return {"parameters.code": [f"The code sandbox is unavailable: {exc}"]}
    return {"parameters.code": [_describe(p) for p in problems]} if problems else {}


def _describe(problem: dict) -> str:
    where = f"line {problem['line']}: " if problem.get("line") else ""
    kind = f"{problem['type']}: " if problem.get("type") else ""
    return f"{where}{kind}{problem.get('message', '')}"


def _preset(slug: str, name: str, runtime: str, code: str, description: str = "") -> PresetSpec:
    return PresetSpec(slug, name, {"runtime": runtime, "code": code, "version": "2"}, description)


kind = register(
    Kind(
        key="code",
        name="Custom code",
        description="Define custom evaluators in Python, JavaScript, or TypeScript. Access inputs, "
        "outputs, and full trace data.",
        parameters=Parameters,
        evaluate=None,
        evaluate_many=evaluate_many,
        evaluate_sessions=evaluate_sessions,
        session_problem=session_problem,
        outputs=None,
        check=check,
        new_defaults={"version": "2"},
        category="code",
        presets=[
            _preset("python_default", "Exact match (Python)", "python", PYTHON_DEFAULT),
            _preset(
                "javascript_default", "Exact match (JavaScript)", "javascript", JAVASCRIPT_DEFAULT
            ),
            _preset(
                "typescript_default", "Exact match (TypeScript)", "typescript", TYPESCRIPT_DEFAULT
            ),
            _preset(
                "latency_check",
                "Latency Check",
                "python",
                _example("trace_latency_check.py"),
                "Root span duration within a threshold.",
            ),
            _preset(
                "token_budget",
                "Token Budget",
                "python",
                _example("trace_token_budget.py"),
                "Tokens of the whole trace within a budget.",
            ),
            _preset("json_validity", "JSON validity", "python", _example("json_validity.py")),
            _preset(
                "multi_metric",
                "Several metrics (dict)",
                "python",
                _example("multi_metric.py"),
                "Returns score, success, a label and a length.",
            ),
        ],
    )
)

# Keep the defaults importable for the editor page's runtime switch.
DEFAULT_CODE = {
    "python": PYTHON_DEFAULT,
    "javascript": JAVASCRIPT_DEFAULT,
    "typescript": TYPESCRIPT_DEFAULT,
}
