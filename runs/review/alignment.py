"""LLM judges aligned from their mistakes: a candidate revision of an ``llm_judge`` whose prompt
carries, as few-shot examples, gold items of a queue the base revision got wrong, measured
against the base on held-out gold items in one run before anyone adopts it.

The queue's gold items the base judged are split, seeded and stratified by gold value, into
train and held-out items. Examples come only from the train items the base got wrong, chosen to
cover the kinds of mistakes seen (false positives and false negatives in turn; each confusion
of labels in turn; the largest errors of scores). Both revisions then judge every held-out item
in the same run, so their records rest on the same items. The model calls are estimated (and
capped) before anything is created."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from evalsite.errors import InvalidInput
from evaluators import services as evaluator_services
from evaluators.judge.shots import shot_messages
from evaluators.kinds.llm_judge import MAX_SHOTS
from evaluators.models import EvaluatorRevision
from evaluators.normalize import EvaluationError
from runs import engine, testsets
from runs.applications import application_create
from runs.models import (
    ACTIVE_RUN_STATUSES,
    AlignmentStatus,
    Annotation,
    AnnotationQueue,
    Application,
    ItemStatus,
    JudgeAlignment,
    Origin,
    QueueItem,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    Scenario,
)
from runs.review import measures
from runs.review.queues import form_fields
from runs.review.reliability import TYPES, pairings, usable
from runs.review.reviews import Conflict
from runs.statistics import bootstrap_rows_ci
from runs.traces import trace_dicts, trace_spans

MIN_HELDOUT = 10
SAMPLE = 3  # held-out items whose prompt is rendered for the token estimate
MAX_EXAMPLE_CHARS = 20_000  # a longer case is passed over as an example
NUMERIC_STRATA = 4


@dataclass
class Case:
    """A gold item the base judged, with what the judge reads and what it said."""

    item: QueueItem
    gold: Any
    predicted: Any
    inputs: dict = field(default_factory=dict)
    outputs: Any = None


@dataclass
class Plan:
    base: EvaluatorRevision
    queue: AnnotationQueue
    gold_field: dict
    output_field: str
    record_type: str
    shots: int
    seed: int
    heldout_fraction: float
    train: list[int]
    heldout: list[int]
    wrong: int
    examples: list[dict]
    few_shot: list[dict]
    rows: list[dict]
    estimate: dict

    def summary(self) -> dict[str, Any]:
        """What the pages and the API show before anything is created."""
        return {
            "base": self.base.reference,
            "queue": {"id": self.queue.pk, "slug": self.queue.slug},
            "gold_field": self.gold_field["name"],
            "output_field": self.output_field,
            "type": self.record_type,
            "shots": self.shots,
            "seed": self.seed,
            "heldout_fraction": self.heldout_fraction,
            "train": self.train,
            "heldout": self.heldout,
            "wrong": self.wrong,
            "examples": self.examples,
            "estimate": self.estimate,
        }


# --- the plan ---------------------------------------------------------------------------------


def alignment_plan(
    *,
    base: EvaluatorRevision,
    queue: AnnotationQueue,
    gold_field: str | None = None,
    output_field: str | None = None,
    shots: int = 4,
    heldout_fraction: float = 0.5,
    seed: int = 0,
) -> Plan:
    """Which items train and which are held out, the examples chosen, and the estimate of the
    comparison's model calls, tokens and cost. Creates nothing; renders the base's prompt for a
    few held-out items (under the project's interactive quota)."""
    _check_settings(base, queue, shots, heldout_fraction, seed)
    parsed = evaluator_services.parameters_validate(
        evaluator_services.kind_resolve(base.kind), base.parameters
    )
    room = MAX_SHOTS - len(parsed.few_shot)
    if shots > room:
        raise InvalidInput(
            {"shots": [f"{base.slug} has {len(parsed.few_shot)} examples already: at most {room}."]}
        )
    output_name, gold = _pairing(base, queue, gold_field, output_field)
    record_type = TYPES[gold["type"]]
    cases = _cases(base, queue, gold, output_name, record_type)
    train, heldout = _split(cases, record_type, heldout_fraction, seed)
    if len(heldout) < MIN_HELDOUT:
        raise InvalidInput(
            {
                "queue": [
                    f"{len(cases)} gold items of {queue.slug} were judged by {base.slug}: "
                    f"{len(heldout)} held out and {len(train)} to learn from; at least "
                    f"{MIN_HELDOUT} must be held out. Settle more items or hold out a larger share."
                ]
            }
        )
    wrong = [case for case in train if _wrong(case, record_type)]
    _load_contents([*wrong, *heldout])
    chosen = _choose(wrong, record_type, shots, seed, parsed)
    if not chosen:
        raise InvalidInput(
            {
                "queue": [
                    f"{base.slug} got {len(wrong)} of the {len(train)} train items wrong"
                    + (": nothing to learn from." if not wrong else ", none usable as an example.")
                ]
            }
        )
    examples = [_example(case, parsed, record_type, gold) for case in chosen]
    few_shot = [*parsed.model_dump(mode="json")["few_shot"], *(_shot(e) for e in examples)]
    candidate = evaluator_services.parameters_validate(
        evaluator_services.kind_resolve(base.kind), {**base.parameters, "few_shot": few_shot}
    )
    rows = [_row(case) for case in heldout]
    plan = Plan(
        base=base,
        queue=queue,
        gold_field=gold,
        output_field=output_name,
        record_type=record_type,
        shots=shots,
        seed=seed,
        heldout_fraction=heldout_fraction,
        train=[case.item.pk for case in train],
        heldout=[case.item.pk for case in heldout],
        wrong=len(wrong),
        examples=examples,
        few_shot=few_shot,
        rows=rows,
        estimate={},
    )
    plan.estimate = _estimate(plan, parsed, candidate, heldout)
    return plan


def _check_settings(base, queue, shots, heldout_fraction, seed) -> None:
    if base.kind != "llm_judge" or base.project_id != queue.project_id:
        raise InvalidInput(
            {"revision": [f"{base.slug} is not an LLM judge of this project: only those align."]}
        )
    problems = {}
    if not 1 <= shots <= MAX_SHOTS:
        problems["shots"] = [f"Between 1 and {MAX_SHOTS}."]
    if not 0.1 <= heldout_fraction <= 0.9:
        problems["heldout_fraction"] = ["Between 0.1 and 0.9."]
    if not 0 <= seed < 2**31:
        problems["seed"] = [f"Between 0 and {2**31 - 1}."]
    if problems:
        raise InvalidInput(problems)


def _pairing(base, queue, gold_field: str | None, output_field: str | None) -> tuple[str, dict]:
    pairs = pairings(base, queue.evaluator)
    if gold_field:
        pairs = [(out, gold) for out, gold in pairs if gold["name"] == gold_field]
        if not pairs:
            names = ", ".join(f["name"] for f in form_fields(queue)) or "none"
            raise InvalidInput(
                {
                    "gold_field": [
                        f"No field {gold_field!r} that {base.slug} answers (fields: {names})."
                    ]
                }
            )
    if not pairs:
        raise InvalidInput(
            {"queue": [f"No field of {queue.slug}'s form is one {base.slug} answers."]}
        )
    output_name, gold = pairs[0]
    if output_field and output_field != output_name:
        properties = ((base.schemas or {}).get("outputs") or {}).get("properties") or {}
        if output_field not in properties:
            raise InvalidInput({"output_field": [f"{base.slug} has no output {output_field!r}."]})
        output_name = output_field
    return output_name, gold


def _cases(base, queue, gold: dict, output_name: str, record_type: str) -> list[Case]:
    """The queue's gold items whose trace the base judged, both answers usable."""
    items = list(
        QueueItem.objects.filter(queue=queue, status=ItemStatus.GOLD, gold__isnull=False)
        .select_related("gold", "trace", "scenario")
        .order_by("position")
    )
    verdicts = dict(
        Annotation.objects.filter(
            revision=base, origin=Origin.AUTO, trace_id__in=[item.trace_id for item in items]
        )
        .order_by("created_at", "pk")
        .values_list("trace_id", "outputs")
    )
    cases = []
    for item in items:
        settled = (item.gold.outputs or {}).get(gold["name"])
        said = (verdicts.get(item.trace_id) or {}).get(output_name, None)
        if item.trace_id in verdicts and usable(settled, record_type) and usable(said, record_type):
            cases.append(Case(item=item, gold=settled, predicted=said))
    return cases


def _split(
    cases: list[Case], record_type: str, fraction: float, seed: int
) -> tuple[list[Case], list[Case]]:
    """Seeded, stratified by gold value (scores by quartile of their distinct values): the same
    share of each stratum is held out, so both halves see the gold's mix."""
    stratum = _strata(cases, record_type)
    strata: dict[Any, list[Case]] = defaultdict(list)
    for case in cases:
        strata[stratum[case.gold]].append(case)
    rng = random.Random(seed)
    train, heldout = [], []
    for key in sorted(strata, key=repr):
        group = strata[key]
        rng.shuffle(group)
        cut = int(len(group) * fraction + 0.5)
        heldout += group[:cut]
        train += group[cut:]
    position = attrgetter("item.position")
    return sorted(train, key=position), sorted(heldout, key=position)


def _strata(cases: list[Case], record_type: str) -> dict[Any, Any]:
    """gold value -> its stratum."""
    values = sorted({case.gold for case in cases})
    if record_type != "numeric" or len(values) <= NUMERIC_STRATA:
        return {value: value for value in values}
    return {value: i * NUMERIC_STRATA // len(values) for i, value in enumerate(values)}


def _wrong(case: Case, record_type: str) -> bool:
    if record_type == "numeric":
        return abs(float(case.predicted) - float(case.gold)) > 1e-9
    return case.predicted != case.gold


def _choose(wrong: list[Case], record_type: str, shots: int, seed: int, parsed) -> list[Case]:
    """``shots`` mistakes covering the confusion cells in turn (the largest errors for
    scores), passing over cases too long to show or with no answer in the judge's shape."""
    usable = [
        case
        for case in wrong
        if _expected(parsed, record_type, case.gold) is not None
        and len(json.dumps([case.inputs, case.outputs], default=str)) <= MAX_EXAMPLE_CHARS
    ]
    if record_type == "numeric":
        usable.sort(key=lambda c: (-abs(float(c.predicted) - float(c.gold)), c.item.position))
        return usable[:shots]
    cells: dict[Any, list[Case]] = defaultdict(list)
    for case in usable:
        cells[(case.gold, case.predicted)].append(case)
    rng = random.Random(seed)
    queues = []
    for key in sorted(cells, key=lambda k: (-len(cells[k]), repr(k))):
        group = cells[key]
        rng.shuffle(group)
        queues.append(group)
    chosen: list[Case] = []
    while len(chosen) < shots and any(queues):
        for group in queues:
            if group and len(chosen) < shots:
                chosen.append(group.pop(0))
    return chosen


def _expected(parsed, record_type: str, gold: Any) -> Any:
    """The gold label as this judge would answer it, or None when its shape cannot say it."""
    shape = parsed.score_type
    if shape == "binary":
        return gold if record_type == "binary" else None
    if shape == "numeric":
        if record_type == "binary":
            value = parsed.score_max if gold else parsed.score_min
        elif record_type == "numeric":
            value = min(max(float(gold), parsed.score_min), parsed.score_max)
        else:
            return None
        return round(value) if parsed.integer_scores else value
    if shape == "categorical":
        ranked = sorted(parsed.categories, key=lambda c: c.score)
        if record_type == "binary":
            return (ranked[-1] if gold else ranked[0]).label
        labels = [c.label for c in parsed.categories]
        return gold if record_type == "categorical" and gold in labels else None
    if record_type == "numeric":
        value = min(max(float(gold), 0.0), 1.0)
    elif record_type == "binary":
        value = 1.0 if gold else 0.0
    else:
        return None
    return {criterion.name: value for criterion in parsed.criteria}


def _load_contents(cases: list[Case]) -> None:
    """What the judge reads of each item: the scenario's inputs (the testcase row) or the
    trace's root inputs, and the root span's outputs."""
    roots: dict[int, dict] = {}
    wanted = {case.item.trace_id: case.item.trace.root_span_id for case in cases}
    spans = trace_spans(case.item.trace for case in cases).filter(parent_id="").order_by("pk")
    for trace_id, span_id, attributes in spans.values_list("trace_id", "span_id", "attributes"):
        if trace_id not in roots or span_id == wanted[trace_id]:
            roots[trace_id] = attributes or {}
    for case in cases:
        data = (roots.get(case.item.trace_id, {}).get("ag") or {}).get("data") or {}
        data = data if isinstance(data, dict) else {}
        scenario = case.item.scenario
        inputs = scenario.inputs if scenario is not None else data.get("inputs")
        case.inputs = inputs if isinstance(inputs, dict) else {"inputs": inputs}
        case.outputs = data.get("outputs")


def _example(case: Case, parsed, record_type: str, gold: dict) -> dict[str, Any]:
    return {
        "item": case.item.pk,
        "trace_id": case.item.trace.trace_id,
        "cell": _cell(case, record_type),
        "gold": case.gold,
        "predicted": case.predicted,
        "inputs": case.inputs,
        "outputs": case.outputs,
        "expected": _expected(parsed, record_type, case.gold),
        "note": f"Reviewers settled {gold['name']} = {json.dumps(case.gold)} for this case.",
    }


def _cell(case: Case, record_type: str) -> str:
    if record_type == "binary":
        return "false positive" if case.predicted else "false negative"
    if record_type == "numeric":
        return f"error {abs(float(case.predicted) - float(case.gold)):g}"
    return f"{case.gold} judged {case.predicted}"


def _shot(example: dict) -> dict[str, Any]:
    keys = ("inputs", "outputs", "expected", "note")
    return {key: example[key] for key in keys}


def _row(case: Case) -> dict[str, Any]:
    """A held-out row as both judges read it: never its gold label (a prompt showing the whole
    inputs would hand them the answer). The gold stays with the queue item, row i being
    ``heldout[i]``."""
    return {**case.inputs, "outputs": case.outputs}


# --- the estimate -------------------------------------------------------------------------------


def _estimate(plan: Plan, parsed, candidate, heldout: list[Case]) -> dict[str, Any]:
    """Calls: each revision judges each held-out item once, and the base's example cases (if
    any) run once when the candidate is saved. Prompt tokens: the base's prompt rendered for a
    few held-out items through the judge's own path, as characters / 4, with the candidate's
    examples on top; answers: the judge's max_tokens, else a guess."""
    rendered = _rendered_sample(plan, parsed, heldout[:SAMPLE])
    base_prompt = round(sum(rendered) / len(rendered)) if rendered else 0
    extra = engine.message_tokens(shot_messages(candidate)) - engine.message_tokens(
        shot_messages(parsed)
    )
    completion = parsed.max_tokens or engine.COMPLETION_GUESS[bool(parsed.reasoning)]
    n, checks = len(plan.heldout), len(plan.base.examples or [])
    prompt_tokens = n * (2 * base_prompt + extra) + checks * (base_prompt + extra)
    calls = 2 * n + checks
    answers = "max_tokens" if parsed.max_tokens else "guessed at"
    notes = [
        f"Prompt tokens are characters / {engine.CHARS_PER_TOKEN} of the base's prompt rendered for "
        f"{len(rendered)} held-out item(s), plus the examples; answers are {answers} "
        f"{completion} tokens.",
        "Repair requests and retries, when the model needs them, come on top.",
    ]
    if checks:
        notes.append(f"The base's {checks} example case(s) run when the candidate is saved.")
    _, model, price = engine.connection_price(plan.queue.project, parsed)
    cost = engine.cost_usd(price, prompt_tokens, calls * completion)
    if price is None:
        notes.append(
            f"No price for {model or 'the model'} on the connection {parsed.connection}: "
            "the cost is unknown."
        )
    return {
        "calls": calls,
        "heldout": n,
        "example_checks": checks,
        "sample": len(rendered),
        "tokens": {
            "base_prompt": base_prompt,
            "candidate_prompt": base_prompt + extra,
            "completion": completion,
            "total": prompt_tokens + calls * completion,
        },
        "cost_usd": cost,
        "connection": parsed.connection,
        "model": model,
        "price": price,
        "notes": notes,
    }


def _rendered_sample(plan: Plan, parsed, sample: list[Case]) -> list[int]:
    """Prompt tokens of the base for each sampled held-out row (as the run will give it)."""
    traces = trace_dicts([case.item.trace for case in sample])
    rendered = []
    for case, row in zip(sample, plan.rows, strict=False):
        try:
            messages = evaluator_services.judge_render(
                project=plan.queue.project,
                parameters=parsed,
                inputs=row,
                outputs=case.outputs,
                trace=traces.get(case.item.trace_id),
            )
        except EvaluationError as exc:
            reason = f"{plan.base.slug}'s prompt fails on held-out item {case.item.pk}: {exc}"
            raise InvalidInput({"revision": [reason]})
        rendered.append(engine.message_tokens(messages))
    return rendered


def _check_caps(estimate: dict, max_cost_usd: float | None, max_calls: int | None) -> None:
    calls, cost = estimate["calls"], estimate["cost_usd"]
    site = settings.EVALSITE_ALIGNMENT_MAX_CALLS
    if calls > site:
        raise InvalidInput(
            {
                "max_calls": [
                    f"{calls} model calls estimated; this site allows at most {site} per "
                    "alignment (EVALSITE_ALIGNMENT_MAX_CALLS). Hold out a smaller share."
                ]
            }
        )
    if max_calls is not None and calls > max_calls:
        raise InvalidInput({"max_calls": [f"{calls} model calls estimated, over {max_calls}."]})
    if max_cost_usd is None:
        return
    if cost is None:
        raise InvalidInput(
            {
                "max_cost_usd": [
                    f"The cost cannot be estimated without a price for {estimate['model']} on "
                    f"the connection {estimate['connection']}; add one, or cap max_calls."
                ]
            }
        )
    if cost > max_cost_usd:
        raise InvalidInput(
            {"max_cost_usd": [f"${cost:.4f} estimated, over the cap of ${max_cost_usd:.4f}."]}
        )


# --- creating, refreshing, deciding -------------------------------------------------------------


def alignment_create(
    *,
    base: EvaluatorRevision,
    queue: AnnotationQueue,
    gold_field: str | None = None,
    output_field: str | None = None,
    shots: int = 4,
    heldout_fraction: float = 0.5,
    seed: int = 0,
    max_cost_usd: float | None = None,
    max_calls: int | None = None,
    author=None,
) -> JudgeAlignment:
    """Plan, check the caps (the caller's and ``EVALSITE_ALIGNMENT_MAX_CALLS``), then in one
    transaction: the candidate revision (not the head), a testset of the held-out items, the
    column application on ``outputs`` and a run of both revisions over it."""
    plan = alignment_plan(
        base=base,
        queue=queue,
        gold_field=gold_field,
        output_field=output_field,
        shots=shots,
        heldout_fraction=heldout_fraction,
        seed=seed,
    )
    _check_caps(plan.estimate, max_cost_usd, max_calls)
    return _create(plan, max_cost_usd, author)


@transaction.atomic
def _create(plan: Plan, max_cost_usd: float | None, author) -> JudgeAlignment:
    project, base, queue = plan.queue.project, plan.base, plan.queue
    person = author if getattr(author, "pk", None) else None
    candidate = evaluator_services.evaluator_revise(
        evaluator=base.evaluator,
        parameters={**base.parameters, "few_shot": plan.few_shot},
        examples=base.examples,
        make_head=False,
        author=person,
        message=f"Aligned from {len(plan.examples)} corrections in queue {queue.slug}",
    )
    if candidate is None:  # the head already carries exactly these examples
        raise Conflict(f"{base.evaluator.slug}'s head already has these examples.", "revision")
    testset = testsets.testset_create(
        project=project,
        name=f"Held-out gold of {queue.name} for {base.slug}",
        rows=plan.rows,
        message=f"{len(plan.rows)} held-out gold items of queue {queue.slug}",
        author=person,
    )
    run = engine.run_submit(
        project=project,
        testset_version=testset.head,
        application=_outputs_application(project),
        revisions=[base, candidate],
        name=f"Alignment of {base.evaluator.name}: {base.slug} vs {candidate.slug}",
        author=person,
        description=f"Both revisions on the held-out gold items of queue {queue.slug}.",
    )
    return JudgeAlignment.objects.create(
        project=project,
        base=base,
        candidate=candidate,
        queue=queue,
        gold_field=plan.gold_field["name"],
        output_field=plan.output_field,
        shots=plan.shots,
        seed=plan.seed,
        train=plan.train,
        heldout=plan.heldout,
        examples=plan.examples,
        estimate={**plan.estimate, "heldout_fraction": plan.heldout_fraction},
        max_cost_usd=max_cost_usd,
        run=run,
        created_by=person,
    )


def _outputs_application(project) -> Application:
    """The project's column application on ``outputs`` (made once)."""
    found = (
        Application.objects.for_project(project)
        .filter(kind=Application.Kind.COLUMN, config__outputs_column="outputs")
        .order_by("pk")
        .first()
    )
    if found is not None:
        return found
    slug, n = "outputs-column", 2
    while Application.objects.filter(project=project, slug=slug).exists():
        slug, n = f"outputs-column-{n}", n + 1
    return application_create(
        project=project,
        name="Outputs column",
        slug=slug,
        kind=Application.Kind.COLUMN,
        config={"outputs_column": "outputs"},
        description="The outputs a testset holds in its outputs column.",
    )


def alignments_refresh_for_run(*, run_id: int) -> int:
    """After a run's cells land: the alignments it belongs to, once it has finished. Returns
    how many were settled."""
    alignments = JudgeAlignment.objects.filter(run_id=run_id, status=AlignmentStatus.RUNNING)
    settled = 0
    for alignment in alignments.select_related("run", "base", "candidate", "queue__revision"):
        settled += alignment_refresh(alignment=alignment).status != AlignmentStatus.RUNNING
    return settled


def alignment_refresh(*, alignment: JudgeAlignment) -> JudgeAlignment:
    """Settle a running alignment whose run has finished: both held-out records (done), or
    the reason there are none (failed). Idempotent; cheap while the run goes on."""
    run = alignment.run
    if alignment.status != AlignmentStatus.RUNNING or run is None:
        return alignment
    run.refresh_from_db(fields=["status", "error"])
    if run.status in ACTIVE_RUN_STATUSES:
        return alignment
    records, error = None, _run_error(run)
    if error is None:
        records = held_out_records(alignment)
        if records is None:
            reason = _first_cell_error(run) or "no verdict came back"
            message = f"No held-out item got a verdict from both revisions: {reason}"
            error = {"message": message, "run": run.pk}
    status = AlignmentStatus.FAILED if error else AlignmentStatus.DONE
    JudgeAlignment.objects.filter(pk=alignment.pk, status=AlignmentStatus.RUNNING).update(
        status=status, records=records or {}, error=error
    )
    alignment.refresh_from_db()
    return alignment


def _run_error(run: Run) -> dict | None:
    if run.status == RunStatus.CANCELLED:
        return {"message": "The run was cancelled.", "run": run.pk}
    if run.status != RunStatus.FAILURE:
        return None
    message = (run.error or {}).get("message") or _first_cell_error(run) or "every cell failed"
    return {"message": f"The run failed: {message}", "run": run.pk}


def _first_cell_error(run: Run) -> str:
    error = (
        Result.objects.filter(run=run, status=ResultStatus.ERROR, error__isnull=False)
        .order_by("pk")
        .values_list("error", flat=True)
        .first()
    )
    return (error or {}).get("message") or ""


def held_out_records(alignment: JudgeAlignment) -> dict[str, Any] | None:
    """Both revisions' records over the held-out items each of them judged (the same items for
    both), and the paired difference of the headline figure."""
    run = alignment.run
    field_ = next(
        (f for f in form_fields(alignment.queue) if f["name"] == alignment.gold_field), None
    )
    if field_ is None or field_["type"] not in TYPES:
        return None
    record_type = TYPES[field_["type"]]
    labels = dict(
        QueueItem.objects.filter(pk__in=alignment.heldout).values_list("pk", "gold__outputs")
    )
    gold = {
        pk: (labels.get(alignment.heldout[index]) or {}).get(alignment.gold_field)
        for pk, index in Scenario.objects.filter(run=run).values_list("pk", "index")
        if index < len(alignment.heldout)
    }
    said = {
        role: _verdicts(run, revision, alignment.output_field)
        for role, revision in (("base", alignment.base), ("candidate", alignment.candidate))
    }
    ids = sorted(
        pk
        for pk, value in gold.items()
        if usable(value, record_type)
        and all(usable(said[role].get(pk), record_type) for role in said)
    )
    if not ids:
        return None
    truth = [gold[pk] for pk in ids]
    records = {
        role: _record(record_type, [said[role][pk] for pk in ids], truth, field_) for role in said
    }
    return {
        **records,
        "type": record_type,
        "figures": list(FIGURES[record_type]),
        "items": len(ids),
        "heldout": len(gold),
        "unjudged": {role: len(gold) - len(said[role]) for role in said},
        "difference": _difference(record_type, said, ids, truth, records),
        "computed_at": timezone.now().isoformat(),
    }


def _verdicts(run: Run, revision, output_field: str) -> dict[int, Any]:
    rows = Result.objects.filter(
        run=run,
        step_key=engine.step_key_for_revision(revision),
        repeat_idx=0,
        status=ResultStatus.SUCCESS,
        annotation__isnull=False,
    ).values_list("scenario_id", "annotation__outputs")
    return {pk: (outputs or {}).get(output_field) for pk, outputs in rows}


def _record(record_type: str, pred: list, truth: list, field_: dict) -> dict:
    if record_type == "binary":
        return measures.binary_record(pred, truth)
    if record_type == "numeric":
        return measures.numeric_record([float(v) for v in pred], [float(v) for v in truth])
    return measures.categorical_record(pred, truth, list(field_.get("choices") or []))


FIGURES = {
    "binary": ("accuracy", "precision", "recall", "specificity", "f1", "kappa"),
    "numeric": ("mae", "pearson", "spearman"),
    "categorical": ("accuracy", "kappa"),
}


def _difference(record_type: str, said: dict, ids: list, truth: list, records: dict) -> dict:
    """candidate - base for every figure; for the headline (accuracy, or the mean absolute
    error of scores) a paired bootstrap interval over the same items."""
    differences: dict[str, Any] = {}
    for name in FIGURES[record_type]:
        a, b = records["base"][name]["value"], records["candidate"][name]["value"]
        differences[name] = {"value": None if a is None or b is None else b - a, "ci": None}
    if record_type == "numeric":
        per_item = [
            np.abs(np.array([float(said[role][pk]) for pk in ids]) - np.array(truth, dtype=float))
            for role in ("base", "candidate")
        ]
        headline = "mae"
    else:
        per_item = [
            np.array([said[role][pk] == t for pk, t in zip(ids, truth, strict=True)], dtype=float)
            for role in ("base", "candidate")
        ]
        headline = "accuracy"
    delta = per_item[1] - per_item[0]
    differences[headline]["ci"] = bootstrap_rows_ci(
        len(delta), lambda rows: delta[rows].mean(axis=1)
    )
    return differences


@transaction.atomic
def alignment_accept(*, alignment: JudgeAlignment, author=None) -> JudgeAlignment:
    """Adopt the candidate: it becomes the evaluator's head."""
    locked = JudgeAlignment.objects.select_for_update().get(pk=alignment.pk)
    if locked.status != AlignmentStatus.DONE or locked.candidate is None:
        raise Conflict(f"This alignment is {locked.status}: only a finished one can be accepted.")
    evaluator_services.evaluator_head_set(
        evaluator=locked.candidate.evaluator, revision=locked.candidate
    )
    return _decide(locked, AlignmentStatus.ACCEPTED)


@transaction.atomic
def alignment_discard(*, alignment: JudgeAlignment, author=None) -> JudgeAlignment:
    """Keep the head as it is; a comparison still running is cancelled."""
    locked = JudgeAlignment.objects.select_for_update().get(pk=alignment.pk)
    if locked.status in (AlignmentStatus.ACCEPTED, AlignmentStatus.DISCARDED):
        raise Conflict(f"This alignment is {locked.status} already.")
    if locked.run is not None and locked.run.status in ACTIVE_RUN_STATUSES:
        engine.run_cancel(run=locked.run)
    return _decide(locked, AlignmentStatus.DISCARDED)


def _decide(alignment: JudgeAlignment, status: str) -> JudgeAlignment:
    alignment.status, alignment.decided_at = status, timezone.now()
    alignment.save(update_fields=["status", "decided_at"])
    return alignment
