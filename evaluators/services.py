"""Evaluator services: create, revise, archive, evaluate (one trace, or a whole session)."""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema
import referencing
from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.text import slugify
from pydantic import ValidationError as PydanticValidationError

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.jsonpaths import dig
from evalsite.models import Project
from evalsite.quotas import interactive_slot
from evaluators import crypto
from evaluators.judge.batch import judge_preview
from evaluators.kinds import get_kind
from evaluators.kinds.base import REGISTRY, Kind, KindParameters
from evaluators.models import Evaluator, EvaluatorRevision, ModelConnection, Preset
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


CHECK_SECONDS = 10.0  # checking code at save (the sandbox's own limit for it)


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


def parameters_seal(
    kind: Kind, parameters: dict[str, Any] | None, stored: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Parameters a person sent, with the kind's secret settings sealed (a webhook's headers).

    Every value is validated in plain text first. In a sealed setting, a value sent as
    ``crypto.MASK`` (what reads show) keeps the ``stored`` one, a new value is encrypted, a name
    left out is removed. Every path that takes parameters from a person goes through here, so a
    sealed value someone pastes is sealed again rather than decrypted for them.
    """
    if not kind.sealed:
        return parameters or {}
    values = parameters_validate(kind, parameters).model_dump(mode="json")
    for name in kind.sealed:
        values[name] = crypto.secrets_seal(
            values.get(name) or {}, (stored or {}).get(name) or {}, field=f"parameters.{name}"
        )
    return values


def parameters_shown(kind: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters as people see them (pages, API, admin): sealed values read as ``MASK``."""
    sealed = REGISTRY[kind].sealed if kind in REGISTRY else ()
    return {
        name: crypto.secrets_mask(value) if name in sealed and isinstance(value, dict) else value
        for name, value in (parameters or {}).items()
    }


def parameters_diffable(kind: str, a: dict[str, Any], b: dict[str, Any]) -> tuple[dict, dict]:
    """Two revisions' parameters to diff: sealed values masked, a changed one marked changed
    ("Authorization": "•••••• (changed)") without showing either value."""
    shown_a, shown_b = parameters_shown(kind, a), parameters_shown(kind, b)
    sealed = REGISTRY[kind].sealed if kind in REGISTRY else ()
    for name in sealed:
        before, after = a.get(name) or {}, b.get(name) or {}
        for header in set(before) & set(after):
            if not _same_secret(before[header], after[header]):
                shown_b[name] = {**shown_b[name], header: f"{crypto.MASK} (changed)"}
    return shown_a, shown_b


def _same_secret(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return crypto.unseal(a) == crypto.unseal(b)
    except crypto.UndecryptableKey:
        return False


def secrets_rotate() -> dict[str, Any]:
    """Re-encrypt every model API key and sealed setting under the first encryption key.

    Revisions are records, so this is the one write to their parameters; only ciphertexts
    change. Values no configured key decrypts are left as they are and listed by id.
    """
    rotated, failed = {"model connections": 0, "evaluator revisions": 0}, []
    with transaction.atomic():
        for connection in ModelConnection.objects.exclude(api_key_encrypted="").select_for_update():
            try:
                token = crypto.rotate(connection.api_key_encrypted)
            except crypto.UndecryptableKey:
                failed.append(f"model connection {connection.pk}")
                continue
            ModelConnection.objects.filter(pk=connection.pk).update(api_key_encrypted=token)
            rotated["model connections"] += 1
        sealed_kinds = [key for key, kind in REGISTRY.items() if kind.sealed]
        revisions = EvaluatorRevision.objects.filter(kind__in=sealed_kinds).select_for_update()
        for revision in revisions.only("pk", "kind", "parameters"):
            try:
                parameters = _resealed(REGISTRY[revision.kind], revision.parameters)
            except crypto.UndecryptableKey:
                failed.append(f"evaluator revision {revision.pk}")
                continue
            EvaluatorRevision.objects.filter(pk=revision.pk).update(parameters=parameters)
            rotated["evaluator revisions"] += 1
    return {"rotated": rotated, "failed": failed}


def _resealed(kind: Kind, parameters: dict[str, Any]) -> dict[str, Any]:
    resealed = dict(parameters)
    for name in kind.sealed:
        values = parameters.get(name) or {}
        resealed[name] = {header: crypto.reseal(value) for header, value in values.items()}
    return resealed


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
    examples_must_pass: bool = False,
) -> Evaluator:
    """Create an evaluator and its first revision.

    Missing parameters get the kind's defaults, exactly as the UI fills them, and a preset's
    values sit under what the caller gave. ``examples_must_pass`` refuses the evaluator
    (``InvalidInput``, nothing saved) when one of its example cases does not pass.
    """
    kind_obj = kind_resolve(kind)
    if not name.strip():
        raise InvalidInput({"name": ["This field is required."]})
    values = dict(kind_obj.new_defaults)
    values.update(preset_parameters(kind_obj, preset, project) if preset else {})
    values.update(parameters or {})
    parsed = parameters_validate(kind_obj, parameters_seal(kind_obj, values))
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
        evaluator,
        kind_obj,
        parsed,
        author,
        message or "Created",
        outputs_schema,
        examples,
        examples_must_pass=examples_must_pass,
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
    make_head: bool = True,
    examples_must_pass: bool = False,
    **fields: Any,
) -> EvaluatorRevision | None:
    """Apply edits. Changed parameters (or schema, or examples) make a new revision; returns it,
    or None when only name/description/archived changed. ``make_head=False`` keeps the current
    head (a candidate revision, measured before anyone adopts it). ``examples_must_pass`` refuses
    the edit (``InvalidInput``, nothing saved) when an example case does not pass."""
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
    parsed = parameters_validate(
        kind_obj, parameters_seal(kind_obj, values, stored=head.parameters if head else None)
    )
    if head and examples is None:
        examples = head.examples
    # An outputs schema sent back as the head has it is no change (a client that sends the whole
    # configuration, as ``evalsite evaluators push`` does, must not make a revision each time).
    if (
        head
        and parsed.model_dump(mode="json") == head.parameters
        and (outputs_schema is None or outputs_schema == (head.schemas or {}).get("outputs"))
        and examples == head.examples
    ):
        return None
    return _revision_create(
        evaluator,
        kind_obj,
        parsed,
        author,
        message,
        outputs_schema,
        examples,
        make_head,
        examples_must_pass,
    )


def evaluator_head_set(*, evaluator: Evaluator, revision: EvaluatorRevision) -> Evaluator:
    """Adopt one of the evaluator's revisions as its head (a candidate that measured well)."""
    if revision.evaluator_id != evaluator.pk:
        raise InvalidInput(
            {"revision": [f"{revision.slug} is not a revision of {evaluator.slug}."]}
        )
    Evaluator.objects.filter(pk=evaluator.pk).update(head=revision, updated_at=timezone.now())
    evaluator.head = revision
    return evaluator


def _revision_create(
    evaluator,
    kind_obj,
    parsed,
    author,
    message,
    outputs_schema,
    examples,
    make_head=True,
    examples_must_pass=False,
):
    schemas = schemas_for(kind_obj, parsed)
    if outputs_schema is not None:
        _check_schema(outputs_schema, "outputs_schema")
        schemas["outputs"] = outputs_schema
    examples = examples_validate(examples or [])
    report = []
    if kind_obj.check is not None or examples:
        # Checking code and running example cases execute the tenant's work while a web
        # thread waits: under the project's interactive quota.
        seconds = CHECK_SECONDS + (settings.EVALSITE_EXAMPLES_SECONDS if examples else 0)
        with interactive_slot(evaluator.project_id, seconds=seconds):
            problems = kind_obj.check(parsed) if kind_obj.check is not None else None
            if problems:
                raise InvalidInput(problems)
            report = examples_run(kind_obj, parsed, examples, evaluator.project) if examples else []
    if examples_must_pass and (failures := examples_failures(report)):
        raise InvalidInput(failures)
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
    if make_head:
        Evaluator.objects.filter(pk=evaluator.pk).update(head=revision, updated_at=timezone.now())
        evaluator.head = revision
    return revision


def examples_validate(examples: Any) -> list[dict[str, Any]]:
    """Example cases: ``[{name?, inputs, outputs, trace?, expected: {success?, score?, outputs?}}]``."""
    if not isinstance(examples, list):
        raise InvalidInput({"examples": ["must be a list of example cases"]})
    if len(examples) > settings.EVALSITE_EXAMPLES_MAX:
        raise InvalidInput(
            {
                "examples": [
                    f"at most {settings.EVALSITE_EXAMPLES_MAX} example cases (EVALSITE_EXAMPLES_MAX);"
                    f" got {len(examples)}. Put larger sets in a testset and run them."
                ]
            }
        )
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


def examples_failures(report: list[dict]) -> dict[str, list[str]]:
    """The cases of an examples report that did not pass (failed, or not run), as field errors
    ``{"examples.<i>": ["<name>: <why>"]}``."""
    failures = {}
    for case in report:
        if case.get("passed") is True:
            continue
        why = list(case.get("problems") or [])
        if (case.get("error") or {}).get("message") and case.get("status") == "error":
            why.append(case["error"]["message"])
        failures[f"examples.{case['index']}"] = [f"{case['name']}: {'; '.join(why)}"]
    return failures


def kind_outputs_schema(kind: str, parameters: dict[str, Any]) -> dict[str, Any] | None:
    """The outputs schema a kind derives from these parameters (None when it derives none, or
    the parameters no longer parse): a revision's ``schemas.outputs`` differs from it when the
    schema was given (``outputs_schema``) or inferred."""
    if kind not in REGISTRY:
        return None
    try:
        return REGISTRY[kind].outputs_schema(REGISTRY[kind].parse(parameters)) or None
    except PydanticValidationError:
        return None


# Parameters that bound one evaluation's time, by whichever name a kind gives them.
_TIMEOUT_FIELDS = ("timeout_s", "timeout_seconds")


def examples_run(
    kind_obj: Kind, parsed: KindParameters, examples: list[dict], project
) -> list[dict]:
    """Evaluate the example cases with these parameters; say which pass and why not.

    They run while the person who saved waits, so within ``EVALSITE_EXAMPLES_SECONDS`` in all:
    each case gets at most the time left, and the cases after the budget is spent are reported
    as not run (never as failing evaluations).
    """
    budget = settings.EVALSITE_EXAMPLES_SECONDS
    deadline = time.monotonic() + budget
    report = []
    for index, case in enumerate(examples):
        left = deadline - time.monotonic()
        if left <= 0.05:
            report.append(_example_not_run(index, case, budget))
            continue
        result = evaluations_invoke_many(
            kind=kind_obj.key,
            parameters=_within(parsed, left).model_dump(mode="json"),
            items=[(case.get("inputs", {}), case.get("outputs"), case.get("trace"))],
            project=project,
        )[0]
        report.append(_example_verdict(index, case, result))
    return report


def _within(parsed: KindParameters, seconds: float) -> KindParameters:
    update = {
        name: min(getattr(parsed, name), round(seconds, 2))
        for name in _TIMEOUT_FIELDS
        if isinstance(getattr(parsed, name, None), int | float)
    }
    return parsed.model_copy(update=update) if update else parsed


def _example_not_run(index: int, case: dict, budget: float) -> dict[str, Any]:
    return {
        "index": index,
        "name": case.get("name") or f"case {index + 1}",
        "passed": None,
        "problems": [
            f"not run: the example cases spent their {budget:g} s budget "
            f"(EVALSITE_EXAMPLES_SECONDS) before this one"
        ],
        "status": "skipped",
        "outputs": None,
        "error": None,
    }


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
    session: dict[str, Any] | None = None,
) -> Evaluation:
    """Evaluate one output with a revision, or with a kind and parameters (the "try it" path).

    With a ``session`` the evaluator judges that whole session instead of a trace
    (``session_evaluations_invoke_many``; ``trace`` is then ignored).
    Never raises for a failing evaluation: the answer is an ``Evaluation`` with status error.
    Bad configuration (unknown kind, invalid parameters) raises ``InvalidInput``; a project
    already using its interactive quota, ``evalsite.quotas.Busy`` (a 429).
    """
    with interactive_slot(project.pk if project else None):
        if session is not None:
            return session_evaluations_invoke_many(
                revision=revision,
                kind=kind,
                parameters=parameters,
                items=[(inputs, outputs, session)],
                project=project,
            )[0]
        return evaluations_invoke_many(
            revision=revision,
            kind=kind,
            parameters=parameters,
            items=[(inputs, outputs, trace)],
            project=project,
        )[0]


def judge_render(
    *,
    project: Project,
    parameters: KindParameters,
    inputs: dict,
    outputs: Any,
    trace,
    session: dict[str, Any] | None = None,
) -> list[dict]:
    """The messages an LLM judge would send for one case (its template or script run), under
    the project's interactive quota; raises ``EvaluationError`` for a template that fails.
    With a ``session``, the prompt of a session evaluation (``trace``: its last turn's)."""
    with interactive_slot(project.pk):
        return judge_preview(parameters, inputs, outputs, trace, session)


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
    kind_obj, parsed, schema = _configuration(revision, kind, parameters)
    if not kind_obj.executes:
        return [_skipped(_not_run(kind_obj)) for _ in items]
    context = _context(revision, project, scope)
    if kind_obj.evaluate_many is not None:
        raws = kind_obj.evaluate_many(parsed, items, context)
    else:
        raws = [_call(kind_obj, parsed, item) for item in items]
    threshold = _threshold(parsed)
    return [_finish(raw, threshold, schema) for raw in raws]


def _configuration(revision, kind: str, parameters) -> tuple[Kind, KindParameters, dict | None]:
    """(kind, parsed parameters, outputs schema) of a revision, or of a kind and parameters."""
    kind_obj = kind_resolve(revision.kind if revision else kind)
    parsed = parameters_validate(kind_obj, revision.parameters if revision else parameters)
    schema = revision.outputs_schema if revision else kind_obj.outputs_schema(parsed)
    return kind_obj, parsed, schema


def _context(revision, project, scope) -> dict[str, Any]:
    return {
        "project": project or (revision.project if revision else None),
        "revision": revision,
        **(scope or {}),
    }


def _threshold(parsed: KindParameters) -> float:
    threshold = getattr(parsed, "threshold", None)
    return DEFAULT_THRESHOLD if threshold is None else threshold


def _not_run(kind_obj: Kind) -> str:
    return f"{kind_obj.name} evaluators are not run; they receive annotations."


# --- sessions ---------------------------------------------------------------------------------


def session_evaluations_invoke_many(
    *,
    revision: EvaluatorRevision | None = None,
    kind: str = "",
    parameters: dict[str, Any] | None = None,
    items: list[tuple[dict, Any, dict]],
    project: Project | None = None,
    scope: dict[str, Any] | None = None,
) -> list[Evaluation]:
    """Evaluate many (inputs, outputs, session) items with one configuration, each session
    (DOMAIN.md: ``{"session_id", "traces", "messages"}``) judged as one conversation.

    Everything ``evaluations_invoke_many`` promises holds: one answer per item in order, errors
    are errors (never scores), bad configuration raises ``InvalidInput``. Beyond it, nothing
    raises for sessions: a configuration that cannot judge sessions answers every item with an
    error ``session_unsupported`` saying why (``revision_session_problem`` tells beforehand);
    a malformed session (``invalid_session``) or one above ``EVALSITE_MAX_BODY_BYTES`` of JSON
    (``session_too_large``) fails its own item. Empty ``inputs`` become the first turn's root
    inputs (``{"input": value}`` when they are not an object), ``None`` outputs the last turn's
    root outputs; kinds then see ``trace`` as the last turn's where they read one.
    """
    kind_obj, parsed, schema = _configuration(revision, kind, parameters)
    if not kind_obj.executes:
        return [_skipped(_not_run(kind_obj)) for _ in items]
    reason = kind_obj.session_support(parsed)
    if reason:
        return [_failed("session_unsupported", reason) for _ in items]
    answers: list[Evaluation | None] = [None] * len(items)
    ready: list[tuple[int, tuple[dict, Any, dict]]] = []
    for index, (inputs, outputs, session) in enumerate(items):
        problem = session_problem(session)
        if problem is not None:
            answers[index] = _failed(*problem)
        else:
            ready.append((index, session_item(inputs, outputs, session)))
    if ready:
        batch = [item for _, item in ready]
        context = _context(revision, project, scope)
        if kind_obj.evaluate_sessions is not None:
            raws = kind_obj.evaluate_sessions(parsed, batch, context)
        else:
            raws = [_call_session(kind_obj, parsed, item) for item in batch]
        threshold = _threshold(parsed)
        for (index, _), raw in zip(ready, raws, strict=True):
            answers[index] = _finish(raw, threshold, schema)
    return answers  # type: ignore[return-value]  # every slot is filled


def revision_session_problem(revision: EvaluatorRevision) -> str | None:
    """None when the revision can judge sessions; otherwise why not, for people to read (a
    session rule with it is refused with this reason on ``revision``)."""
    kind_obj = REGISTRY.get(revision.kind)
    if kind_obj is None:
        return f"Unknown kind {revision.kind!r}."
    if not kind_obj.executes:
        return f"{_not_run(kind_obj)} People review sessions in annotation queues instead."
    try:
        parsed = kind_obj.parse(revision.parameters)
    except PydanticValidationError as exc:
        return f"The revision's parameters no longer validate: {exc.errors()[0]['msg']}."
    return kind_obj.session_support(parsed)


def session_shape_problem(session: Any) -> str | None:
    """What makes ``session`` other than a session dict, or None. ``messages`` may be left
    out (no conversation text); ``traces`` are trace objects, ``{"spans": {...}}`` at least.

    Only this outer shape is checked: what a span or a message holds is the sender's business.
    Every reader of a session that passes (the judge's transcript and outline, the agent score,
    code evaluators) takes odd inner shapes (``tool_calls`` that is not a list, ``children``
    that is not an object, ...) as absent or as an error of that evaluation; nothing crashes."""
    if not isinstance(session, dict):
        return "a session is an object: {session_id, traces: [trace, ...], messages: [...]}"
    if not isinstance(session.get("session_id", ""), str):
        return "session_id: must be a string"
    traces, messages = session.get("traces"), session.get("messages", [])
    if not isinstance(traces, list):
        return "traces: must be a list of the session's traces, oldest first"
    for index, trace in enumerate(traces):
        if not isinstance(trace, dict) or not isinstance(trace.get("spans"), dict):
            return f"traces[{index}]: must be a trace, an object with spans keyed by span id"
    if not isinstance(messages, list):
        return "messages: must be a list of OpenAI-style messages"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"messages[{index}]: must be a message object with a role"
    if not traces and not messages:
        return "the session is empty: give its traces, its messages, or both"
    return None


def session_problem(session: Any) -> tuple[str, str] | None:
    """(error code, message) when the session cannot be evaluated as it is, else None."""
    shape = session_shape_problem(session)
    if shape is not None:
        return "invalid_session", f"The session is malformed: {shape}."
    limit = settings.EVALSITE_MAX_BODY_BYTES
    size = len(json.dumps(session, ensure_ascii=False, separators=(",", ":"), default=str).encode())
    if size > limit:
        return "session_too_large", (
            f"The session is {size:,} bytes of JSON; evaluators take sessions up to {limit:,} "
            f"bytes (EVALSITE_MAX_BODY_BYTES, the largest request evalsite accepts). Judge "
            f"fewer turns, or raise the limit."
        )
    return None


def session_item(inputs: Any, outputs: Any, session: dict) -> tuple[dict, Any, dict]:
    """The item as kinds receive it, empty inputs and missing outputs taken from the turns."""
    traces = session.get("traces") or []
    if not inputs and traces:
        first = _root_data(traces[0]).get("inputs")
        inputs = first if isinstance(first, dict) else {} if first is None else {"input": first}
    if outputs is None and traces:
        outputs = _root_data(traces[-1]).get("outputs")
    session = {**session, "messages": session.get("messages") or []}
    return (inputs if isinstance(inputs, dict) else {}), outputs, session


def _root_data(trace: dict) -> dict:
    roots = [s for s in (trace.get("spans") or {}).values() if isinstance(s, dict)]
    data = dig(roots[0], "attributes.ag.data") if roots else None
    return data if isinstance(data, dict) else {}


def _call_session(kind_obj: Kind, parsed: KindParameters, item) -> Raw:
    inputs, outputs, session = item
    started = time.perf_counter()
    try:
        value = kind_obj.evaluate_session(parsed, inputs, outputs, session)
    except Exception as exc:
        return Raw(error=exc, duration_ms=_ms(started))
    return Raw(value=value, duration_ms=_ms(started))


def _failed(code: str, message: str) -> Evaluation:
    kind = "".join(part.title() for part in code.split("_"))
    return Evaluation(
        "error", error={"code": code, "type": kind, "message": message, "stacktrace": ""}
    )


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
