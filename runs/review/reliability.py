"""Reliability records: how far each evaluator revision agrees with gold labels on the traces
both judged, and pass rates corrected for the measured sensitivity and specificity."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from evaluators.models import Evaluator, EvaluatorRevision, ReliabilityRecord
from runs import metrics
from runs.models import Annotation, Origin, Result, ResultStatus, Run, StepType
from runs.review import measures

# A gold field pairs with the revision's output of the same name, else with the output that
# plays its part in every judge's answer (judges always say success; numeric ones a score).
STAND_INS = {"binary": "success", "numeric": "score", "categorical": "label"}
TYPES = {
    "boolean": "binary",
    "integer": "numeric",
    "number": "numeric",
    "categorical": "categorical",
}


def _gold(project_id: int, gold_evaluator: Evaluator, trace_ids=None) -> dict[int, dict]:
    """trace id -> the gold label's outputs (the latest, when several queues settled it)."""
    rows = Annotation.objects.filter(
        project_id=project_id, evaluator=gold_evaluator, origin=Origin.GOLD, trace__isnull=False
    )
    if trace_ids is not None:
        rows = rows.filter(trace_id__in=trace_ids)
    gold: dict[int, dict] = {}
    for trace_id, outputs in rows.order_by("updated_at", "pk").values_list("trace_id", "outputs"):
        gold[trace_id] = outputs or {}
    return gold


def _predictions(revision: EvaluatorRevision, trace_ids) -> dict[int, dict]:
    """trace id -> the revision's latest automatic verdict on it."""
    rows = Annotation.objects.filter(
        revision=revision, origin=Origin.AUTO, trace_id__in=list(trace_ids)
    ).order_by("created_at", "pk")
    return dict(rows.values_list("trace_id", "outputs"))


def gold_fields(gold_evaluator: Evaluator) -> list[dict[str, Any]]:
    fields = (gold_evaluator.head.parameters.get("fields") or []) if gold_evaluator.head else []
    return [field for field in fields if field["type"] in TYPES]


def pairings(revision: EvaluatorRevision, gold_evaluator: Evaluator) -> list[tuple[str, dict]]:
    """(output field, gold field) pairs this revision can be measured on. The outputs are read
    with the schema its metrics use: declared, the kind's, or inferred from what it returned
    (a code evaluator or a webhook declares none)."""
    schema, _ = metrics.revision_outputs_schema(revision)
    properties = (schema or {}).get("properties") or {}
    pairs = []
    for field in gold_fields(gold_evaluator):
        record_type = TYPES[field["type"]]
        for name in (field["name"], STAND_INS[record_type]):
            if _compatible(properties.get(name), record_type):
                pairs.append((name, field))
                break
    return pairs


def _compatible(prop: dict | None, record_type: str) -> bool:
    if not prop:
        return False
    kinds = prop.get("type")
    kinds = set(kinds) if isinstance(kinds, list) else {kinds}
    if record_type == "binary":
        return "boolean" in kinds
    if record_type == "numeric":
        return bool(kinds & {"number", "integer"})
    return "string" in kinds


def usable(value: Any, record_type: str) -> bool:
    """Whether a value can be measured as a record of this type (a bool is not a number)."""
    if record_type == "binary":
        return isinstance(value, bool)
    if record_type == "numeric":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _repeats(revision: EvaluatorRevision, trace_ids, output_field: str) -> list[list[Any]]:
    """The revision's verdicts on each gold item across a run's repeats: the scenarios whose
    first invocation is the gold trace, every repeat's cell of the revision's step."""
    scenarios = Result.objects.filter(
        trace_id__in=list(trace_ids), repeat_idx=0, annotation__isnull=True
    ).values("scenario_id")
    rows = Result.objects.filter(
        scenario_id__in=scenarios,
        step_key=f"evaluator-{revision.slug}",
        status=ResultStatus.SUCCESS,
        annotation__isnull=False,
    ).values_list("scenario_id", "annotation__outputs")
    groups: dict[int, list[Any]] = {}
    for scenario_id, outputs in rows.order_by("scenario_id", "repeat_idx"):
        groups.setdefault(scenario_id, []).append((outputs or {}).get(output_field))
    return [group for group in groups.values() if len(group) > 1]


def record_compute(
    revision: EvaluatorRevision,
    gold_evaluator: Evaluator,
    output_field: str,
    gold_field: dict,
    *,
    trace_ids=None,
) -> dict[str, Any] | None:
    """The figures of one pairing, over the gold items (``trace_ids`` when given) the revision
    judged; None when there is none."""
    record_type = TYPES[gold_field["type"]]
    gold = _gold(revision.project_id, gold_evaluator, trace_ids)
    predicted = _predictions(revision, gold.keys())
    pred, truth, used = [], [], []
    for trace_id, outputs in predicted.items():
        p, g = (outputs or {}).get(output_field), gold[trace_id].get(gold_field["name"])
        if usable(p, record_type) and usable(g, record_type):
            pred.append(p)
            truth.append(g)
            used.append(trace_id)
    if not pred:
        return None
    if record_type == "binary":
        figures = measures.binary_record(pred, truth)
    elif record_type == "numeric":
        figures = measures.numeric_record([float(v) for v in pred], [float(v) for v in truth])
    else:
        figures = measures.categorical_record(pred, truth, list(gold_field.get("choices") or []))
    figures["consistency"] = measures.consistency(_repeats(revision, used, output_field))
    return figures


@transaction.atomic
def reliability_refresh(
    *, revision: EvaluatorRevision, gold_evaluator: Evaluator | None = None
) -> list[ReliabilityRecord]:
    """Recompute the revision's records against one gold evaluator, or every one of the
    project that has gold labels."""
    if gold_evaluator is None:
        ids = (
            Annotation.objects.filter(project_id=revision.project_id, origin=Origin.GOLD)
            .values_list("evaluator_id", flat=True)
            .distinct()
        )
        golds = list(Evaluator.objects.filter(pk__in=ids).select_related("head"))
    else:
        golds = [gold_evaluator]
    records = []
    for gold in golds:
        for output_field, field in pairings(revision, gold):
            figures = record_compute(revision, gold, output_field, field)
            key = {
                "revision": revision,
                "gold_evaluator": gold,
                "output_field": output_field,
                "gold_field": field["name"],
            }
            if figures is None:
                ReliabilityRecord.objects.filter(**key).delete()
                continue
            record, _ = ReliabilityRecord.objects.update_or_create(
                **key,
                defaults={
                    "project_id": revision.project_id,
                    "type": figures["type"],
                    "items": figures["n"],
                    "figures": figures,
                    "computed_at": timezone.now(),
                },
            )
            records.append(record)
    return records


def reliability_refresh_for_traces(*, project_id: int, trace_ids: list[int]) -> int:
    """After gold labels change on these traces: every revision that judged them. Returns how
    many records were written."""
    golds = Evaluator.objects.filter(
        pk__in=Annotation.objects.filter(
            project_id=project_id, origin=Origin.GOLD, trace_id__in=trace_ids
        ).values("evaluator_id")
    ).select_related("head")
    revisions = EvaluatorRevision.objects.filter(
        pk__in=Annotation.objects.filter(
            project_id=project_id, origin=Origin.AUTO, trace_id__in=trace_ids
        ).values("revision_id")
    )
    written = 0
    for revision in revisions:
        for gold in golds:
            written += len(reliability_refresh(revision=revision, gold_evaluator=gold))
    return written


def reliability_refresh_for_run(*, run_id: int) -> int:
    """After a run's cells land: when any of its traces carries a gold label (one query),
    refresh the records of its evaluators."""
    traces = Result.objects.filter(run_id=run_id, trace__isnull=False).values("trace_id")
    gold_traces = list(
        Annotation.objects.filter(origin=Origin.GOLD, trace_id__in=traces)
        .values_list("trace_id", flat=True)
        .distinct()
    )
    if not gold_traces:
        return 0
    project_id = Run.objects.values_list("project_id", flat=True).get(pk=run_id)
    return reliability_refresh_for_traces(project_id=project_id, trace_ids=gold_traces)


INLINE_VERDICTS = 5_000  # a request recomputes records over at most this many verdicts


def gold_verdicts(revision: EvaluatorRevision):
    """The revision's automatic verdicts on traces that carry a gold label: what a refresh of
    its records reads (the pages and the API count them before recomputing in a request)."""
    gold = Annotation.objects.filter(
        project_id=revision.project_id, origin=Origin.GOLD, trace__isnull=False
    ).values("trace_id")
    return Annotation.objects.filter(revision=revision, origin=Origin.AUTO, trace_id__in=gold)


def records_for(revisions) -> dict[int, list[ReliabilityRecord]]:
    """revision id -> its records (for pages and the API)."""
    found: dict[int, list[ReliabilityRecord]] = {}
    rows = ReliabilityRecord.objects.filter(revision__in=revisions).select_related("gold_evaluator")
    for record in rows.order_by("gold_evaluator__slug", "gold_field"):
        found.setdefault(record.revision_id, []).append(record)
    return found


def corrected_rates(run: Run) -> dict[str, list[dict[str, Any]]]:
    """step key -> for each binary record of the step's revision, the observed pass rate of
    its output field and the Rogan-Gladen rate corrected for the record's sensitivity and
    specificity, with an interval that carries the record's own uncertainty."""
    steps = list(run.steps.filter(type=StepType.ANNOTATION, revision__isnull=False))
    records = records_for([step.revision_id for step in steps])
    corrected: dict[str, list[dict[str, Any]]] = {}
    for step in steps:
        for record in records.get(step.revision_id, []):
            if record.type != "binary":
                continue
            field = f"annotation__outputs__{record.output_field}"
            counts = Result.objects.filter(
                run=run, step_key=step.key, status=ResultStatus.SUCCESS
            ).aggregate(
                passed=Count("pk", filter=Q(**{field: True})),
                failed=Count("pk", filter=Q(**{field: False})),
            )
            n = counts["passed"] + counts["failed"]
            if not n:
                continue
            rate = measures.rogan_gladen(counts["passed"], n, record.figures["confusion"])
            corrected.setdefault(step.key, []).append(
                {
                    "metric": record.output_field,
                    "gold_evaluator": record.gold_evaluator.slug,
                    "gold_field": record.gold_field,
                    "gold_items": record.items,
                    "passed": counts["passed"],
                    "n": n,
                    **rate,
                }
            )
    return corrected
