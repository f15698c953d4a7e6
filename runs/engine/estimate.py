"""What a run will cost before it starts: cells, calls, tokens and dollars (docs/runs.md).

An estimate creates nothing. Cells and application calls are counted exactly. An LLM judge's
prompt tokens come from its own prompt rendered (template or script, through the judge's path
and under the project's interactive quota) for a sample of the testset's rows, as characters / 4
plus the chat format's tokens per message; its answer tokens are the mean of the revision's last
recorded calls when there are enough of them, else ``max_tokens``, else a guess; prices are the
model connection's. Repair requests and retries, when a model needs them, add their prompts on
top (their answers are in the recorded mean once there is one).

A run is refused up front when the estimate is over the run's cap (``max_cost_usd``) or the
project's (``Project.max_run_cost_usd``), never stopped half-way for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from evalsite.errors import InvalidInput
from evalsite.models import Project
from evaluators import services as evaluator_services
from evaluators.models import EvaluatorRevision, ModelConnection
from evaluators.normalize import EvaluationError
from runs.models import Annotation, Application, Span, Testcase, TestsetVersion

SAMPLE_ROWS = 5  # rows whose judge prompt is rendered
CHARS_PER_TOKEN = 4  # no tokenizer for arbitrary models: a common rule of thumb
TOKENS_PER_MESSAGE = 4  # the chat format's own tokens around each message
COMPLETION_GUESS = {True: 150, False: 20}  # an answer's tokens, with or without reasoning
HISTORY_CALLS = 200  # recent calls of a revision whose answer tokens are averaged
HISTORY_MIN = 5  # fewer recorded calls than this: not a history yet
JUDGE_KIND = "llm_judge"


def message_tokens(messages: list[dict]) -> int:
    """Tokens of chat messages as a model would count them, near enough without its tokenizer."""
    chars = sum(len(m.get("content") or "") for m in messages)
    return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def connection_price(project: Project, parsed) -> tuple[str, str, dict | None]:
    """(connection slug, model, price per million tokens or None) of a judge's parameters."""
    connection = ModelConnection.objects.for_project(project).by_ref(parsed.connection).first()
    model = getattr(parsed, "model", "") or (
        (connection.model_names or [""])[0] if connection else ""
    )
    price = connection.price_of(model) if connection else None
    return (connection.slug if connection else parsed.connection), model, price


def cost_usd(price: dict | None, prompt_tokens: int, completion_tokens: int) -> float | None:
    if price is None:
        return None
    return (
        prompt_tokens * float(price.get("prompt", 0))
        + completion_tokens * float(price.get("completion", 0))
    ) / 1_000_000


@dataclass
class Step:
    key: str
    type: str
    cells: int
    calls: int = 0
    tokens: dict[str, int] | None = None
    cost_usd: float | None = None
    notes: list[str] = field(default_factory=list)
    judge: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        data = {
            "key": self.key,
            "type": self.type,
            "cells": self.cells,
            "calls": self.calls,
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "notes": self.notes,
        }
        if self.judge is not None:
            data["judge"] = self.judge
        return data


def run_estimate(
    *,
    project: Project,
    testset_version: TestsetVersion | None,
    application: Application | None,
    revisions: list[EvaluatorRevision] = (),
    repeats: int = 1,
    max_cost_usd: Decimal | float | None = None,
    sample: int = SAMPLE_ROWS,
) -> dict[str, Any]:
    """The projected size and cost of a batch run, with the caps beside it. Creates nothing."""
    scenarios = testset_version.row_count if testset_version else 0
    cells = scenarios * repeats
    sampled = _sample_rows(testset_version, sample)
    rows = [row for _, row in sampled]
    steps = [Step(key="inputs", type="input", cells=scenarios)]
    app_calls = 0
    if application is not None:
        app_calls = cells if application.kind == Application.Kind.HTTP else 0
        step = Step(key=application.slug, type="invocation", cells=cells, calls=app_calls)
        if application.kind == Application.Kind.HTTP:
            step.notes.append(f"{app_calls} calls to {application.name}'s endpoint.")
        steps.append(step)
    for revision in revisions:
        steps.append(_evaluator_step(project, application, revision, rows, cells))
    judged = [s for s in steps if s.judge is not None]
    costs = [s.cost_usd for s in judged]
    total_cost = None if any(c is None for c in costs) else sum(costs)
    counted = [s for s in judged if s.tokens is not None]
    tokens = {
        "prompt": sum(s.tokens["prompt"] for s in counted),
        "completion": sum(s.tokens["completion"] for s in counted),
    }
    tokens["total"] = tokens["prompt"] + tokens["completion"]
    caps = {
        "run": _float(max_cost_usd),
        "project": _float(project.max_run_cost_usd),
        "judges": {
            s.key: s.judge["max_cost_usd"] for s in judged if s.judge["max_cost_usd"] is not None
        },
    }
    notes = []
    if judged:
        notes.append(
            "Judge prompts are characters / 4 of each judge's prompt rendered for "
            f"{len(rows)} row(s); repair requests and retries, when a model needs them, add "
            "their prompts on top."
        )
    binding = [c for c in (caps["run"], caps["project"]) if c is not None]
    cap = min(binding) if binding else None
    return {
        "scenarios": scenarios,
        "repeats": repeats,
        "cells": sum(s.cells for s in steps),
        "steps": [s.as_dict() for s in steps],
        "application_calls": app_calls,
        "judge_calls": sum(s.calls for s in judged),
        "tokens": tokens,
        "cost_usd": total_cost if judged else 0.0,
        "caps": caps,
        "cap_usd": cap,
        "over_cap": bool(cap is not None and total_cost is not None and total_cost > cap),
        "sample_rows": len(rows),
        "sample_indexes": [index for index, _ in sampled],
        "notes": notes,
    }


def estimate_check(estimate: dict[str, Any]) -> None:
    """Refuse a run whose estimate is over the run's or the project's cap, with the figures, or
    whose cost cannot be told while a cap is set."""
    cap = estimate["cap_usd"]
    if cap is None or not estimate["judge_calls"]:
        return
    which = "the run's cap" if cap == estimate["caps"]["run"] else "the project's cap per run"
    cost = estimate["cost_usd"]
    if cost is None:
        unknown = [s["key"] for s in estimate["steps"] if s.get("judge") and s["cost_usd"] is None]
        raise InvalidInput(
            {
                "max_cost_usd": [
                    f"{which.capitalize()} is ${cap:.4f}, but the cost of {', '.join(unknown)} "
                    "cannot be projected (its model has no price on the connection, or it "
                    "builds its model calls from traces during the run), so the cap cannot be "
                    "kept. Add the price on the Connections page, or run without a cap."
                ]
            }
        )
    if cost > cap:
        raise InvalidInput(
            {
                "max_cost_usd": [
                    f"${cost:.4f} projected ({estimate['judge_calls']} judge calls, "
                    f"{estimate['tokens']['total']:,} tokens), over {which} of ${cap:.4f}. "
                    "Nothing was started."
                ]
            }
        )


def _float(value) -> float | None:
    return None if value is None else float(value)


def _sample_rows(version: TestsetVersion | None, sample: int) -> list[tuple[int, dict]]:
    """Up to ``sample`` (index, row) pairs spread evenly over the testset: the first, the last
    and between."""
    if version is None or not version.row_count or sample <= 0:
        return []
    n = version.row_count
    k = min(sample, n)
    picks = sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})
    return list(
        Testcase.objects.filter(version=version, index__in=picks)
        .order_by("index")
        .values_list("index", "data")
    )


def _evaluator_step(project, application, revision, rows, cells) -> Step:
    kind = evaluator_services.kind_resolve(revision.kind)
    step = Step(key=revision.slug, type="annotation", cells=cells)
    if not kind.executes:
        step.notes.append("Waits for people's annotations: nothing runs.")
        return step
    parsed = evaluator_services.parameters_validate(kind, revision.parameters)
    if revision.kind == JUDGE_KIND:
        return _judge_step(project, application, revision, parsed, rows, cells, step)
    if getattr(parsed, "connection", None):
        return _model_step(project, parsed, cells, step)
    if revision.kind == "webhook":
        step.calls = cells
        step.notes.append(f"{cells} webhook calls.")
    elif revision.kind == "code":
        step.notes.append("Runs in the code sandbox: no model spend.")
    return step


def _model_step(project, parsed, cells, step: Step) -> Step:
    """An evaluator other than the LLM judge that calls a model connection (an agent scorer's
    goal and plan calls): its calls are counted, but what it sends is built from each trace at
    run time, so its tokens and cost are unknown and a cap cannot pass it."""
    connection, model, price = connection_price(project, parsed)
    step.calls = cells
    step.judge = {
        "connection": connection,
        "model": model,
        "price": price,
        "prompt_tokens_per_call": None,
        "completion_tokens_per_call": None,
        "completion_source": None,
        "max_cost_usd": getattr(parsed, "max_cost_usd", None),
    }
    step.notes.append(
        f"Calls the model connection {connection} (at least {cells} calls); what it sends is "
        "built from each trace during the run, so its tokens and cost cannot be projected."
    )
    return step


def _judge_step(project, application, revision, parsed, rows, cells, step: Step) -> Step:
    prompts = []
    outputs_column = _outputs_column(application)
    for row in rows:
        outputs = row.get(outputs_column) if outputs_column else None
        try:
            messages = evaluator_services.judge_render(
                project=project, parameters=parsed, inputs=row, outputs=outputs, trace=None
            )
        except EvaluationError as exc:
            raise InvalidInput({"evaluators": [f"{revision.slug}'s prompt fails on a row: {exc}"]})
        prompts.append(message_tokens(messages))
    prompt = round(sum(prompts) / len(prompts)) if prompts else 0
    completion, source = _completion_tokens(revision, parsed)
    connection, model, price = connection_price(project, parsed)
    step.calls = cells
    step.tokens = {
        "prompt": prompt * cells,
        "completion": completion * cells,
        "total": (prompt + completion) * cells,
    }
    step.cost_usd = cost_usd(price, prompt * cells, completion * cells)
    step.judge = {
        "connection": connection,
        "model": model,
        "price": price,
        "prompt_tokens_per_call": prompt,
        "completion_tokens_per_call": completion,
        "completion_source": source,
        "max_cost_usd": parsed.max_cost_usd,
    }
    if application is not None and outputs_column is None:
        step.notes.append(
            "The application's answers are not known before it runs: the prompts were rendered "
            "without them, so answers that appear in the prompt add to these figures."
        )
    if price is None:
        step.notes.append(f"No price for {model or 'the model'} on {connection}: cost unknown.")
    own_cap = parsed.max_cost_usd
    if own_cap is not None and step.cost_usd is not None and step.cost_usd > own_cap:
        step.notes.append(
            f"{revision.slug} stops calling at its own cap of ${own_cap:.4f}, about "
            f"{int(cells * own_cap / step.cost_usd)} of {cells} calls."
        )
    return step


def _outputs_column(application: Application | None) -> str | None:
    if application is None or application.kind != Application.Kind.COLUMN:
        return None
    return application.config.get("outputs_column", "outputs")


def _completion_tokens(revision: EvaluatorRevision, parsed) -> tuple[int, str]:
    """Answer tokens per call: the mean of the revision's recent calls, else max_tokens, else a
    guess; with where the figure came from."""
    calls = list(
        Annotation.objects.filter(revision=revision, judge_trace__isnull=False)
        .order_by("-id")
        .values_list("judge_trace_id", "judge_trace__created_at")[:HISTORY_CALLS]
    )
    per_trace: dict[int, float] = {}
    spans = Span.objects.filter(  # the traces' days: their spans' partitions (docs/traces.md)
        trace_id__in=[pk for pk, _ in calls], trace_time__in={at for _, at in calls}
    ).values_list("trace_id", "attributes__ag__metrics__unit__tokens__completion")
    for trace_id, tokens in spans:  # a call's repairs are spans of its trace: they add up
        if isinstance(tokens, int | float) and not isinstance(tokens, bool):
            per_trace[trace_id] = per_trace.get(trace_id, 0) + tokens
    recent = list(per_trace.values())
    if len(recent) >= HISTORY_MIN:
        return round(sum(recent) / len(recent)), f"the mean of {len(recent)} recent calls"
    if parsed.max_tokens:
        return parsed.max_tokens, "max_tokens (an upper bound)"
    return COMPLETION_GUESS[bool(parsed.reasoning)], "a guess (no calls recorded yet)"
