"""Evaluator services: create, revise, archive, evaluate."""

from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema
import referencing
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.text import slugify
from pydantic import ValidationError as PydanticValidationError

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Project
from evaluators.kinds import get_kind
from evaluators.kinds.base import REGISTRY, Kind, KindParameters
from evaluators.models import Evaluator, EvaluatorRevision, Preset
from evaluators.normalize import DEFAULT_THRESHOLD, EvaluationError, Raw, normalize


@dataclass
class Evaluation:
    """The answer of one evaluation: success with outputs, or an error; never both."""

    status: str  # success | error | skipped
    outputs: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    duration_ms: float = 0.0
    logs: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- configuration ----------------------------------------------------------------------------


def kind_resolve(key: str) -> Kind:
    try:
        return get_kind(key)
    except KeyError as exc:
        raise InvalidInput({"kind": [str(exc.args[0])]})


def parameters_validate(kind: Kind, parameters: dict[str, Any] | None) -> KindParameters:
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidInput({"parameters": ["must be a JSON object"]})
    try:
        return kind.parse(parameters)
    except PydanticValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="parameters"))


def schemas_for(kind: Kind, parsed: KindParameters) -> dict[str, Any]:
    schemas: dict[str, Any] = {"parameters": kind.settings_template()}
    outputs = kind.outputs_schema(parsed)
    if outputs:
        schemas["outputs"] = outputs
    return schemas


def preset_parameters(kind: Kind, preset: str, project: Project | None = None) -> dict[str, Any]:
    scope = Q(project__isnull=True) | Q(project=project) if project else Q(project__isnull=True)
    # A project's own preset wins over a built-in one of the same slug.
    found = (
        Preset.objects.filter(scope, kind=kind.key, slug=preset)
        .order_by(F("project_id").asc(nulls_last=True))
        .first()
    )
    if found is None:
        known = ", ".join(p.slug for p in kind.presets) or "none"
        raise InvalidInput(
            {"preset": [f"Unknown preset {preset!r} for {kind.key}; known: {known}."]}
        )
    return dict(found.parameters)


def _unique_slug(project: Project, base: str) -> str:
    base = slugify(base)[:90] or "evaluator"
    slug, n = base, 2
    while Evaluator.objects.filter(project=project, slug=slug).exists():
        slug, n = f"{base}-{n}", n + 1
    return slug


@transaction.atomic
def evaluator_create(
    *,
    project: Project,
    kind: str,
    name: str,
    slug: str = "",
    description: str = "",
    parameters: dict[str, Any] | None = None,
    preset: str = "",
    author=None,
    message: str = "",
    outputs_schema: dict[str, Any] | None = None,
    examples: list | None = None,
) -> Evaluator:
    """Create an evaluator and its first revision.

    Missing parameters get the kind's defaults, exactly as the UI fills them, and a preset's
    values sit under what the caller gave.
    """
    kind_obj = kind_resolve(kind)
    if not name.strip():
        raise InvalidInput({"name": ["This field is required."]})
    values = dict(kind_obj.new_defaults)
    values.update(preset_parameters(kind_obj, preset, project) if preset else {})
    values.update(parameters or {})
    parsed = parameters_validate(kind_obj, values)
    if slug and Evaluator.objects.filter(project=project, slug=slug).exists():
        raise InvalidInput({"slug": [f"An evaluator with slug {slug!r} already exists."]})
    evaluator = Evaluator.objects.create(
        project=project,
        slug=slug or _unique_slug(project, name),
        name=name,
        description=description,
        kind=kind_obj.key,
        created_by=_person(author),
    )
    _revision_create(
        evaluator, kind_obj, parsed, author, message or "Created", outputs_schema, examples
    )
    return evaluator


@transaction.atomic
def evaluator_revise(
    *,
    evaluator: Evaluator,
    parameters: dict[str, Any] | None = None,
    partial: bool = False,
    author=None,
    message: str = "",
    outputs_schema: dict[str, Any] | None = None,
    examples: list | None = None,
    **fields: Any,
) -> EvaluatorRevision | None:
    """Apply edits. Changed parameters (or schema, or examples) make a new revision; returns it,
    or None when only name/description/archived changed."""
    evaluator = Evaluator.objects.select_for_update().get(pk=evaluator.pk)
    for name in ("name", "description", "archived"):
        if name in fields and fields[name] is not None:
            setattr(evaluator, name, fields[name])
    evaluator.updated_at = timezone.now()
    evaluator.save()
    head = evaluator.head
    if parameters is None and outputs_schema is None and examples is None:
        return None
    kind_obj = kind_resolve(evaluator.kind)
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidInput({"parameters": ["must be a JSON object"]})
    values = dict(head.parameters) if (partial and head) else {}
    values.update(parameters if parameters is not None else (head.parameters if head else {}))
    parsed = parameters_validate(kind_obj, values)
    if head and examples is None:
        examples = head.examples
    if (
        head
        and parsed.model_dump(mode="json") == head.parameters
        and outputs_schema is None
        and examples == head.examples
    ):
        return None
    return _revision_create(evaluator, kind_obj, parsed, author, message, outputs_schema, examples)


def _revision_create(evaluator, kind_obj, parsed, author, message, outputs_schema, examples):
    if kind_obj.check is not None:
        problems = kind_obj.check(parsed)
        if problems:
            raise InvalidInput(problems)
    schemas = schemas_for(kind_obj, parsed)
    if outputs_schema is not None:
        _check_schema(outputs_schema, "outputs_schema")
        schemas["outputs"] = outputs_schema
    examples = examples_validate(examples or [])
    report = examples_run(kind_obj, parsed, examples, evaluator.project) if examples else []
    last = evaluator.revisions.order_by("-version").values_list("version", flat=True).first() or 0
    revision = EvaluatorRevision.objects.create(
        project_id=evaluator.project_id,
        evaluator=evaluator,
        version=last + 1,
        slug=f"{evaluator.slug}-v{last + 1}",
        kind=kind_obj.key,
        parameters=parsed.model_dump(mode="json"),
        schemas=schemas,
        examples=examples,
        examples_report=report,
        message=message[:500],
        author=_person(author),
    )
    Evaluator.objects.filter(pk=evaluator.pk).update(head=revision, updated_at=timezone.now())
    evaluator.head = revision
    return revision


def examples_validate(examples: Any) -> list[dict[str, Any]]:
    """Example cases: ``[{name?, inputs, outputs, trace?, expected: {success?, score?, outputs?}}]``."""
    if not isinstance(examples, list):
        raise InvalidInput({"examples": ["must be a list of example cases"]})
    for i, case in enumerate(examples):
        if not isinstance(case, dict) or not isinstance(case.get("inputs", {}), dict):
            raise InvalidInput(
                {
                    f"examples.{i}": [
                        "each case is an object with inputs (an object), outputs, expected"
                    ]
                }
            )
        expected = case.get("expected", {})
        if not isinstance(expected, dict) or not set(expected) <= {
            "success",
            "score",
            "outputs",
            "status",
        }:
            raise InvalidInput(
                {
                    f"examples.{i}.expected": [
                        'give success, score, outputs or status (e.g. {"success": true})'
                    ]
                }
            )
    return examples


def examples_run(
    kind_obj: Kind, parsed: KindParameters, examples: list[dict], project
) -> list[dict]:
    """Evaluate every example case with these parameters; say which pass and why not."""
    items = [(case.get("inputs", {}), case.get("outputs"), case.get("trace")) for case in examples]
    results = evaluations_invoke_many(
        kind=kind_obj.key, parameters=parsed.model_dump(mode="json"), items=items, project=project
    )
    return [
        _example_verdict(i, case, result)
        for i, (case, result) in enumerate(zip(examples, results, strict=True))
    ]


def _example_verdict(index: int, case: dict, result: Evaluation) -> dict[str, Any]:
    expected = case.get("expected", {})
    outputs = result.outputs or {}
    problems = []
    if expected.get("status", "success") != result.status:
        problems.append(f"status {result.status}, expected {expected.get('status', 'success')}")
    for key in ("success", "score"):
        if key in expected and outputs.get(key) != expected[key]:
            problems.append(f"{key} {outputs.get(key)!r}, expected {expected[key]!r}")
    if "outputs" in expected and outputs != expected["outputs"]:
        problems.append("outputs differ from the expected outputs")
    return {
        "index": index,
        "name": case.get("name") or f"case {index + 1}",
        "passed": not problems,
        "problems": problems,
        "status": result.status,
        "outputs": result.outputs,
        "error": result.error,
    }


def _check_schema(schema: Any, field_name: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidInput({field_name: ["must be a JSON Schema object"]})
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidInput({field_name: [f"not a valid JSON Schema: {exc.message}"]})


def _person(user):
    return user if getattr(user, "pk", None) else None


def presets_sync() -> None:
    """Mirror the kinds' built-in presets into the Preset table (idempotent; runs after migrate)."""
    for kind in REGISTRY.values():
        for spec in kind.presets:
            Preset.objects.update_or_create(
                project=None,
                kind=kind.key,
                slug=spec.slug,
                defaults={
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": spec.parameters,
                },
            )


# --- evaluation -------------------------------------------------------------------------------


def evaluation_invoke(
    *,
    revision: EvaluatorRevision | None = None,
    kind: str = "",
    parameters: dict[str, Any] | None = None,
    inputs: dict[str, Any],
    outputs: Any,
    trace: dict[str, Any] | None = None,
    project: Project | None = None,
) -> Evaluation:
    """Evaluate one output with a revision, or with a kind and parameters (the "try it" path).

    Never raises for a failing evaluation: the answer is an ``Evaluation`` with status error.
    Bad configuration (unknown kind, invalid parameters) raises ``InvalidInput``.
    """
    return evaluations_invoke_many(
        revision=revision,
        kind=kind,
        parameters=parameters,
        items=[(inputs, outputs, trace)],
        project=project,
    )[0]


def evaluations_invoke_many(
    *,
    revision: EvaluatorRevision | None = None,
    kind: str = "",
    parameters: dict[str, Any] | None = None,
    items: list[tuple[dict[str, Any], Any, dict[str, Any] | None]],
    project: Project | None = None,
    scope: dict[str, Any] | None = None,
) -> list[Evaluation]:
    """Evaluate many (inputs, outputs, trace) items with one configuration.

    Kinds that batch (code evaluators send one batch to a warm sandbox worker) get the whole
    list at once; the others are called item by item. ``scope`` tells batch kinds what the
    work belongs to (``run_id`` or ``rule_id``: an LLM judge's spend cap counts per run/rule).
    """
    kind_obj = kind_resolve(revision.kind if revision else kind)
    parsed = parameters_validate(kind_obj, revision.parameters if revision else parameters)
    schema = revision.outputs_schema if revision else kind_obj.outputs_schema(parsed)
    if not kind_obj.executes:
        reason = f"{kind_obj.name} evaluators are not run; they receive annotations."
        return [_skipped(reason) for _ in items]
    context = {
        "project": project or (revision.project if revision else None),
        "revision": revision,
        **(scope or {}),
    }
    if kind_obj.evaluate_many is not None:
        raws = kind_obj.evaluate_many(parsed, items, context)
    else:
        raws = [_call(kind_obj, parsed, item) for item in items]
    threshold = getattr(parsed, "threshold", None)
    threshold = DEFAULT_THRESHOLD if threshold is None else threshold
    return [_finish(raw, threshold, schema) for raw in raws]


def _call(kind_obj: Kind, parsed: KindParameters, item) -> Raw:
    inputs, outputs, trace = item
    started = time.perf_counter()
    try:
        value = kind_obj.evaluate(parsed, inputs, outputs, trace)
    except Exception as exc:
        return Raw(error=exc, duration_ms=_ms(started))
    return Raw(value=value, duration_ms=_ms(started))


def _finish(raw: Raw, threshold: float, schema: dict | None) -> Evaluation:
    if raw.error is not None:
        return Evaluation(
            "error",
            error=error_dict(raw.error),
            duration_ms=raw.duration_ms,
            logs=raw.logs,
            details=raw.details,
        )
    try:
        outputs = normalize(raw.value, threshold)
        if schema:
            schema_check(outputs, schema)
    except EvaluationError as exc:
        return Evaluation(
            "error",
            error=exc.as_dict(),
            duration_ms=raw.duration_ms,
            logs=raw.logs,
            details=raw.details,
        )
    return Evaluation(
        "success", outputs=outputs, duration_ms=raw.duration_ms, logs=raw.logs, details=raw.details
    )


def schema_check(outputs: dict[str, Any], schema: dict[str, Any]) -> None:
    # An empty registry: a $ref to a URL must never make the server fetch it.
    validator = jsonschema.Draft202012Validator(schema, registry=referencing.Registry())
    error = jsonschema.exceptions.best_match(validator.iter_errors(outputs))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(the outputs)"
        raise EvaluationError(
            f"Outputs do not match the evaluator's outputs schema at {where}: {error.message}",
            code="schema_mismatch",
        )


def error_dict(exc: BaseException) -> dict[str, str]:
    if isinstance(exc, EvaluationError):
        return exc.as_dict()
    return {
        "code": "evaluator_exception",
        "type": type(exc).__name__,
        "message": str(exc) or type(exc).__name__,
        "stacktrace": "".join(traceback.format_exception(exc)),
    }


def _skipped(reason: str) -> Evaluation:
    return Evaluation(
        "skipped", error={"code": "skipped", "type": "skipped", "message": reason, "stacktrace": ""}
    )


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)
