"""Annotation queues: creating and changing them, their members, and the items they hold
(a run's scenarios by filter, online traces by a feed filter, or traces added by hand)."""

from __future__ import annotations

import random
from typing import Any, Literal

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Max, QuerySet
from django.utils import timezone
from django.utils.text import slugify
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evalsite.errors import InvalidInput, pydantic_fields
from evalsite.models import Membership, Project
from evaluators.models import Evaluator
from runs import online
from runs.models import (
    AnnotationQueue,
    ItemSource,
    QueueItem,
    Result,
    ResultStatus,
    Run,
    Scenario,
    ScenarioStatus,
    StepType,
    Trace,
)

MAX_REVIEWERS = 5
LABEL_TYPES = ("boolean", "categorical", "integer", "number")
ITEMS_PER_ADD = 10_000  # one request adds at most this many items


def form_fields(queue: AnnotationQueue) -> list[dict[str, Any]]:
    """The review form: the human-feedback revision's fields ({name, type, required, ...})."""
    return list(queue.revision.parameters.get("fields") or [])


def label_fields(queue: AnnotationQueue) -> list[dict[str, Any]]:
    """The fields agreement and gold labels are about: everything but free text."""
    return [field for field in form_fields(queue) if field["type"] in LABEL_TYPES]


# --- queues -----------------------------------------------------------------------------------


class QueueSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    instructions: str = Field("", max_length=20_000)
    reviewers_per_item: int = Field(2, ge=1, le=MAX_REVIEWERS)
    blind: bool = True
    min_agreement: float = Field(1.0, ge=0, le=1)
    reservation_seconds: int = Field(900, ge=30, le=7 * 86_400)
    sampling_rate: float = Field(1.0, ge=0, le=1)


def _settings(values: dict[str, Any]) -> QueueSettings:
    try:
        return QueueSettings.model_validate(values)
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc))


def _human_evaluator(project: Project, ref: Evaluator | str | int) -> Evaluator:
    evaluator = (
        ref
        if isinstance(ref, Evaluator)
        else Evaluator.objects.for_project(project).by_ref(ref).select_related("head").first()
    )
    if evaluator is None or evaluator.project_id != project.pk:
        raise InvalidInput({"evaluator": [f"No evaluator {ref!r} in this project."]})
    if evaluator.kind != "human" or evaluator.head is None:
        raise InvalidInput(
            {
                "evaluator": [
                    f"{evaluator.slug} is a {evaluator.kind} evaluator; a queue's form "
                    "is a human-feedback evaluator's."
                ]
            }
        )
    fields = evaluator.head.parameters.get("fields") or []
    if not any(field["type"] in LABEL_TYPES for field in fields):
        raise InvalidInput(
            {"evaluator": [f"{evaluator.slug} has only free-text fields: nothing to agree on."]}
        )
    return evaluator


def members_resolve(project: Project, names: list[str] | None, field: str) -> list:
    """Users by username (or id); each must be a member of the project, any role."""
    if not names:
        return []
    users = []
    User = get_user_model()
    for name in names:
        text = str(name)
        query = User.objects.filter(username=text)
        user = query.first() or (
            User.objects.filter(pk=int(text)).first() if text.isdecimal() else None
        )
        if user is None or not Membership.objects.filter(project=project, user=user).exists():
            raise InvalidInput({field: [f"{text!r} is not a member of this project."]})
        users.append(user)
    return list({user.pk: user for user in users}.values())


def _unique_slug(project: Project, base: str) -> str:
    base = slugify(base)[:90] or "queue"
    taken = set(
        AnnotationQueue.objects.filter(project=project, slug__startswith=base).values_list(
            "slug", flat=True
        )
    )
    slug, n = base, 2
    while slug in taken:
        slug, n = f"{base}-{n}", n + 1
    return slug


@transaction.atomic
def queue_create(
    *,
    project: Project,
    name: str,
    evaluator: Evaluator | str | int,
    slug: str = "",
    instructions: str = "",
    reviewers_per_item: int = 2,
    blind: bool = True,
    min_agreement: float = 1.0,
    reservation_seconds: int = 900,
    reviewers: list[str] | None = None,
    adjudicators: list[str] | None = None,
    trace_filter: dict | None = None,
    sampling_rate: float = 1.0,
    author=None,
) -> AnnotationQueue:
    """A queue over a human-feedback evaluator's form (its head revision, pinned)."""
    values = _settings(
        {
            "name": name,
            "instructions": instructions,
            "reviewers_per_item": reviewers_per_item,
            "blind": blind,
            "min_agreement": min_agreement,
            "reservation_seconds": reservation_seconds,
            "sampling_rate": sampling_rate,
        }
    )
    human = _human_evaluator(project, evaluator)
    if trace_filter is not None:
        online.filter_parse(trace_filter)
    if slug and AnnotationQueue.objects.filter(project=project, slug=slug).exists():
        raise InvalidInput({"slug": [f"A queue with slug {slug!r} already exists."]})
    reviewer_users = members_resolve(project, reviewers, "reviewers")
    adjudicator_users = members_resolve(project, adjudicators, "adjudicators")
    queue = AnnotationQueue.objects.create(
        project=project,
        slug=slugify(slug)[:100] if slug else _unique_slug(project, name),
        evaluator=human,
        revision=human.head,
        trace_filter=trace_filter,
        created_by=author if getattr(author, "pk", None) else None,
        **values.model_dump(),
    )
    queue.reviewers.set(reviewer_users)
    queue.adjudicators.set(adjudicator_users)
    return queue


@transaction.atomic
def queue_update(
    *,
    queue: AnnotationQueue,
    reviewers: list[str] | None = None,
    adjudicators: list[str] | None = None,
    trace_filter: dict | Literal["unchanged"] | None = "unchanged",
    archived: bool | None = None,
    **fields: Any,
) -> AnnotationQueue:
    """Change settings and members. The form stays the one the queue was made with: reviews
    already given were answers to it."""
    queue = AnnotationQueue.objects.select_for_update().get(pk=queue.pk)
    current = QueueSettings.model_validate(
        {name: getattr(queue, name) for name in QueueSettings.model_fields}
    ).model_dump()
    unknown = set(fields) - set(current)
    if unknown:
        raise InvalidInput({sorted(unknown)[0]: ["This field cannot be changed."]})
    values = _settings({**current, **{k: v for k, v in fields.items() if v is not None}})
    for name, value in values.model_dump().items():
        setattr(queue, name, value)
    if trace_filter != "unchanged":
        if trace_filter is not None:
            online.filter_parse(trace_filter)
        queue.trace_filter = trace_filter
    if archived is not None:
        queue.archived = archived
    queue.updated_at = timezone.now()
    queue.save()
    if reviewers is not None:
        queue.reviewers.set(members_resolve(queue.project, reviewers, "reviewers"))
    if adjudicators is not None:
        queue.adjudicators.set(members_resolve(queue.project, adjudicators, "adjudicators"))
    return queue


# --- items ------------------------------------------------------------------------------------


def _items_insert(
    queue: AnnotationQueue,
    pairs: list[tuple[int, int | None]],
    *,
    source: str,
    run: Run | None = None,
) -> int:
    """Append (trace id, scenario id) pairs not yet in the queue, in the given order."""
    if not pairs:
        return 0
    locked = AnnotationQueue.objects.select_for_update().get(pk=queue.pk)  # positions in order
    present = set(
        QueueItem.objects.filter(queue=locked, trace_id__in=[t for t, _ in pairs]).values_list(
            "trace_id", flat=True
        )
    )
    start = (QueueItem.objects.filter(queue=locked).aggregate(m=Max("position"))["m"] or 0) + 1
    rows, seen = [], set(present)
    for trace_id, scenario_id in pairs:
        if trace_id in seen:
            continue
        seen.add(trace_id)
        rows.append(
            QueueItem(
                project_id=locked.project_id,
                queue=locked,
                trace_id=trace_id,
                run=run,
                scenario_id=scenario_id,
                source=source,
                position=start + len(rows),
            )
        )
    try:
        QueueItem.objects.bulk_create(rows)
    except IntegrityError:  # the same trace added by a concurrent request: nothing is lost
        raise InvalidInput(
            {"items": ["Items were added at the same moment; try again."]}, status=409
        )
    return len(rows)


@transaction.atomic
def items_add_traces(
    *, queue: AnnotationQueue, trace_ids: list[str], source: str = ItemSource.API
) -> int:
    """Add traces by their trace id (or database id); unknown ones are refused by name."""
    if len(trace_ids) > ITEMS_PER_ADD:
        raise InvalidInput({"trace_ids": [f"At most {ITEMS_PER_ADD} at a time."]})
    texts = [str(ref) for ref in trace_ids]
    found = dict(
        Trace.objects.filter(project_id=queue.project_id, trace_id__in=texts).values_list(
            "trace_id", "pk"
        )
    )
    missing = [text for text in texts if text not in found]
    if missing:
        raise InvalidInput({"trace_ids": [f"No trace {missing[0]!r} in this project."]})
    return _items_insert(queue, [(found[text], None) for text in texts], source=source)


@transaction.atomic
def items_add_scenarios(
    *, queue: AnnotationQueue, run: Run, indexes: list[int], source: str = ItemSource.MANUAL
) -> int:
    """Add a run's scenarios by index (the drill-in's "Send to a queue")."""
    if run.project_id != queue.project_id:
        raise InvalidInput({"run": ["No such run in this project."]})
    traces = scenario_traces(run, Scenario.objects.filter(run=run, index__in=indexes))
    missing = [index for index in indexes if index not in traces]
    if missing:
        raise InvalidInput(
            {"indexes": [f"Scenario {missing[0]} has no output trace to review yet."]}
        )
    return _items_insert(queue, [traces[index] for index in indexes], source=source, run=run)


def scenario_traces(run: Run, scenarios: QuerySet[Scenario]) -> dict[int, tuple[int, int]]:
    """index -> (trace id, scenario id): what a reviewer reads for each scenario. Online runs
    evaluate a trace; batch runs review their application's output trace (first repeat)."""
    if run.is_online:
        return {
            index: (trace_id, pk)
            for index, trace_id, pk in scenarios.filter(trace__isnull=False).values_list(
                "index", "trace_id", "pk"
            )
        }
    invoked = Result.objects.filter(
        run=run,
        scenario__in=scenarios,
        repeat_idx=0,
        trace__isnull=False,
        step_key__in=run.steps.filter(type=StepType.INVOCATION).values("key"),
    ).values_list("scenario__index", "trace_id", "scenario_id")
    return {index: (trace_id, pk) for index, trace_id, pk in invoked}


class RunSelection(BaseModel):
    """Which of a run's scenarios to add: ``all``, ``failed`` (an evaluator said no),
    ``errors`` (an evaluator or the application failed), ``metric_range`` (a step's metric
    between min and max), ``disagreement`` (two steps' metrics differ), each optionally cut to a
    seeded random sample of ``n``."""

    model_config = ConfigDict(extra="forbid")

    select: Literal["all", "failed", "errors", "metric_range", "disagreement"] = "all"
    step: str = ""
    metric: str = "success"
    min: float | None = None
    max: float | None = None
    step_b: str = ""
    metric_b: str = ""
    n: int | None = Field(None, ge=1, le=ITEMS_PER_ADD)
    seed: int = 0

    @model_validator(mode="after")
    def _needs(self) -> RunSelection:
        if self.select in ("metric_range", "disagreement") and not self.step:
            raise ValueError(f"{self.select} needs step (an evaluator step key or slug)")
        if self.select == "metric_range" and self.min is None and self.max is None:
            raise ValueError("metric_range needs min or max")
        if self.select == "disagreement" and not self.step_b:
            raise ValueError("disagreement needs step_b")
        return self


def _step_key(run: Run, ref: str, field: str) -> str:
    steps = run.steps.filter(type=StepType.ANNOTATION)
    found = steps.filter(key=ref).first() or steps.filter(key=f"evaluator-{ref}").first()
    found = found or steps.filter(references__evaluator__slug=ref).order_by("position").first()
    if found is None:
        keys = ", ".join(steps.values_list("key", flat=True)) or "none"
        raise InvalidInput({field: [f"No evaluator step {ref!r} in this run (steps: {keys})."]})
    return found.key


def _values(run: Run, step_key: str, metric: str) -> dict[int, Any]:
    """scenario id -> the step's output ``metric`` (first repeat)."""
    rows = Result.objects.filter(
        run=run, step_key=step_key, repeat_idx=0, annotation__isnull=False
    ).values_list("scenario_id", "annotation__outputs")
    return {scenario_id: (outputs or {}).get(metric) for scenario_id, outputs in rows}


def _selected(run: Run, selection: RunSelection) -> list[int]:
    scenarios = Scenario.objects.filter(run=run)
    if selection.select == "errors":
        errored = Result.objects.filter(run=run, status=ResultStatus.ERROR).values("scenario_id")
        return list(scenarios.filter(pk__in=errored).values_list("pk", flat=True)) or list(
            scenarios.filter(status=ScenarioStatus.ERRORS).values_list("pk", flat=True)
        )
    if selection.select == "failed":
        failed = Result.objects.filter(
            run=run, repeat_idx=0, annotation__outputs__success=False
        ).values("scenario_id")
        return list(scenarios.filter(pk__in=failed).values_list("pk", flat=True))
    if selection.select == "metric_range":
        values = _values(run, _step_key(run, selection.step, "step"), selection.metric)
        return sorted(
            pk
            for pk, value in values.items()
            if isinstance(value, int | float)
            and (selection.min is None or value >= selection.min)
            and (selection.max is None or value <= selection.max)
        )
    if selection.select == "disagreement":
        a = _values(run, _step_key(run, selection.step, "step"), selection.metric)
        b = _values(
            run,
            _step_key(run, selection.step_b, "step_b"),
            selection.metric_b or selection.metric,
        )
        return sorted(pk for pk in a.keys() & b.keys() if a[pk] != b[pk])
    return list(scenarios.values_list("pk", flat=True))


@transaction.atomic
def items_add_from_run(*, queue: AnnotationQueue, run: Run, selection: dict | None = None) -> int:
    """Add a run's scenarios chosen by ``selection`` (see RunSelection); returns how many."""
    if run.project_id != queue.project_id:
        raise InvalidInput({"run": ["No such run in this project."]})
    try:
        chosen = RunSelection.model_validate(selection or {})
    except ValidationError as exc:
        raise InvalidInput(pydantic_fields(exc, prefix="selection"))
    ids = _selected(run, chosen)
    if chosen.n is not None and len(ids) > chosen.n:
        ids = sorted(random.Random(chosen.seed).sample(sorted(ids), chosen.n))
    if len(ids) > ITEMS_PER_ADD:
        raise InvalidInput({"selection": [f"{len(ids)} scenarios; add at most {ITEMS_PER_ADD}."]})
    traces = scenario_traces(run, Scenario.objects.filter(pk__in=ids))
    order = sorted(traces)
    if chosen.n is not None:  # a sample is reviewed in a random order too
        random.Random(chosen.seed).shuffle(order)
    return _items_insert(queue, [traces[index] for index in order], source=ItemSource.RUN, run=run)


def items_feed(*, project_id: int, trace_ids: list[int]) -> int:
    """Online feed: freshly stored traces that match a queue's filter (sampled) join it."""
    added = 0
    queues = AnnotationQueue.objects.filter(
        project_id=project_id, archived=False, trace_filter__isnull=False
    ).select_related("project")
    for queue in queues:
        matched = online.traces_matching(
            project=queue.project,
            filter=queue.trace_filter,
            traces=Trace.objects.filter(project_id=project_id, pk__in=trace_ids),
        )
        ids = list(
            online.traces_sampled(matched, queue.sampling_rate)
            .order_by("start_time", "pk")
            .values_list("pk", flat=True)
        )
        with transaction.atomic():
            added += _items_insert(queue, [(pk, None) for pk in ids], source=ItemSource.RULE)
    return added
