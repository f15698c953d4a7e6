"""Evaluator pages: list, new (kind, then preset), detail with settings, history, diff, try it,
and how far to trust it (the reliability records the runs app computes against gold labels)."""

from __future__ import annotations

import difflib
import json

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from evalsite.errors import InvalidInput
from evalsite.quotas import Busy
from evalsite.views import project_view
from evaluators import selectors
from evaluators.forms import (
    PREFIX,
    EvaluatorMetaForm,
    ExamplesForm,
    RevisionMessageForm,
    SettingsForm,
    TryForm,
)
from evaluators.kinds import REGISTRY
from evaluators.kinds.code import DEFAULT_CODE
from evaluators.models import Preset, ReliabilityRecord
from evaluators.samples import sample_case, sample_from_request
from evaluators.sandbox import sandbox_status
from evaluators.services import (
    evaluation_invoke,
    evaluator_create,
    evaluator_revise,
    kind_resolve,
    parameters_diffable,
    parameters_seal,
)


@project_view()
def evaluator_list(request, project):
    search = request.GET.get("q", "").strip()
    kind = request.GET.get("kind", "")
    archived = request.GET.get("archived") == "1"
    evaluators = selectors.evaluator_list(
        project=project, search=search, kind=kind, archived=archived
    )
    context = {
        "project": project,
        "evaluators": evaluators,
        "kinds": sorted(REGISTRY.values(), key=lambda k: k.name),
        "q": search,
        "kind": kind,
        "archived": archived,
    }
    template = "evaluators/list.html#evaluator-table" if request.htmx else "evaluators/list.html"
    return render(request, template, context)


@project_view()
def evaluator_new(request, project):
    """Step 1 picks a kind; step 2 (``?kind=``) an optional preset, a name and the settings.

    For code evaluators the page is the code editor, with a playground that posts here too
    (``playground`` in the form) to run the unsaved code.
    """
    kind_key = request.GET.get("kind") or request.POST.get("kind")
    if not kind_key:
        kinds = sorted(REGISTRY.values(), key=lambda k: (k.category, k.name))
        return render(request, "evaluators/new_kind.html", {"project": project, "kinds": kinds})
    try:
        kind = kind_resolve(kind_key)
    except InvalidInput:
        raise Http404("Unknown kind.")
    preset = _preset(project, kind, request.GET.get("preset", ""))
    initial = {**kind.new_defaults, **(preset.parameters if preset else {})}
    playground = request.method == "POST" and "playground" in request.POST
    if request.method == "POST" and not playground:
        meta = EvaluatorMetaForm(request.POST)
        settings_form = SettingsForm(kind, request.POST, initial_parameters=initial)
        examples_form = ExamplesForm(request.POST)
        if all([meta.is_valid(), settings_form.is_valid(), examples_form.is_valid()]):
            try:
                evaluator = evaluator_create(
                    project=project,
                    kind=kind.key,
                    author=request.user,
                    parameters=settings_form.cleaned_parameters,
                    examples=examples_form.cleaned_data["examples"],
                    **meta.cleaned_data,
                )
            except InvalidInput as exc:
                _errors_onto(exc, settings_form, meta, examples_form)
            else:
                messages.success(request, f"Evaluator {evaluator.name} created.")
                return redirect("evaluator-detail", project.slug, evaluator.slug)
    else:
        meta = EvaluatorMetaForm(initial={"name": preset.name if preset else kind.name})
        settings_form = SettingsForm(kind, initial_parameters=initial)
        examples_form = ExamplesForm.for_revision(None)
    context = {
        "project": project,
        "kind": kind,
        "presets": _presets(project, kind).order_by("name"),
        "preset": preset,
        "meta": meta,
        "settings_form": settings_form,
        "can_edit": True,
    }
    status = 200
    if kind.key == "code":
        context |= _code_context(kind, examples_form=examples_form)
        playground_context, status = (
            _try(request, project, kind, parameters=initial)
            if playground
            else ({"try_form": TryForm(initial=_sample_for(kind))}, 200)
        )
        context |= playground_context | {"try_url": request.get_full_path()}
        if playground and request.htmx:
            return render(request, "evaluators/new.html#try-panel", context, status=status)
    return render(request, "evaluators/new.html", context, status=status)


def _presets(project, kind):
    return Preset.objects.filter(kind=kind.key, project__isnull=True) | Preset.objects.filter(
        kind=kind.key, project=project
    )


def _preset(project, kind, slug: str) -> Preset | None:
    return _presets(project, kind).filter(slug=slug).first() if slug else None


def _errors_onto(exc: InvalidInput, settings_form, *forms) -> None:
    """Put each problem of a refused save on the field it names, else above the settings."""
    for path, reasons in exc.fields.items():
        head, _, rest = path.partition(".")
        form = next((f for f in forms if head in f.fields), None)
        name = PREFIX + rest.split(".")[0]
        for reason in reasons:
            if form is not None:
                form.add_error(head, f"{path}: {reason}" if rest else reason)
            elif head == "parameters" and name in settings_form.fields:
                settings_form.add_error(name, reason)
            else:
                settings_form.add_error(None, f"{path}: {reason}")


def _evaluator_or_404(project, ref):
    evaluator = selectors.evaluator_get(project=project, ref=ref)
    if evaluator is None:
        raise Http404("No such evaluator.")
    return evaluator


@project_view()
def evaluator_detail(request, project, ref):
    """The evaluator page; ``?preset=`` loads a preset's values into the form (not saved)."""
    evaluator = _evaluator_or_404(project, ref)
    kind = kind_resolve(evaluator.kind)
    head = evaluator.head
    preset = _preset(project, kind, request.GET.get("preset", ""))
    initial = {**(head.parameters if head else {}), **(preset.parameters if preset else {})}
    settings_form = SettingsForm(kind, initial_parameters=initial)
    if request.htmx and request.htmx.target == "evaluator-reliability":
        context = {
            "project": project,
            "evaluator": evaluator,
            "can_edit": request.role in ("editor", "owner"),
            "fragment": True,
        }
        return render(
            request,
            "evaluators/detail.html#evaluator-reliability",
            context | _reliability_context(evaluator),
        )
    context = _detail_context(request, project, evaluator, kind, settings_form) | {"preset": preset}
    if request.htmx and kind.key == "code":
        return render(request, "evaluators/detail.html#code-settings", context)
    return render(request, "evaluators/detail.html", context)


def _detail_context(
    request, project, evaluator, kind, settings_form, message_form=None, examples_form=None
):
    revisions = list(evaluator.revisions.select_related("author"))
    context = {
        "project": project,
        "evaluator": evaluator,
        "kind": kind,
        "settings_form": settings_form,
        "message_form": message_form or RevisionMessageForm(),
        "try_form": TryForm(initial=_sample_for(kind, request, project)),
        "try_url": reverse("evaluator-try", args=[project.slug, evaluator.slug]),
        "revisions": revisions,
        "can_edit": request.role in ("editor", "owner"),
        "outputs_schema": json.dumps((evaluator.head.schemas or {}).get("outputs"), indent=2)
        if evaluator.head
        else "null",
    }
    if kind.key == "code":
        context |= _code_context(kind, evaluator.head, examples_form)
        context["presets"] = _presets(project, kind).order_by("name")
    return context | _reliability_context(evaluator)


# --- how far to trust it ------------------------------------------------------------------------

FEW_GOLD_ITEMS = 30  # below this, the intervals are wide

# (figure key, label, style, what it means), in the order shown, per record type.
FIGURES = {
    "binary": [
        (
            "accuracy",
            "Accuracy",
            "percent",
            "Share of gold items on which it gives the gold verdict.",
        ),
        ("precision", "Precision", "percent", "Of the items it passes, the share the gold passes."),
        (
            "recall",
            "Recall (sensitivity)",
            "percent",
            "Of the items the gold passes, the share it passes.",
        ),
        (
            "specificity",
            "Specificity",
            "percent",
            "Of the items the gold fails, the share it fails.",
        ),
        ("f1", "F1", "decimal", "Harmonic mean of precision and recall."),
        (
            "kappa",
            "Cohen's κ",
            "decimal",
            "Agreement with the gold beyond chance: 0 is chance, 1 perfect.",
        ),
    ],
    "numeric": [
        (
            "pearson",
            "Pearson r",
            "decimal",
            "Linear correlation of its scores with the gold scores.",
        ),
        (
            "spearman",
            "Spearman ρ",
            "decimal",
            "Rank correlation: does it order items as people do?",
        ),
        (
            "mae",
            "Mean absolute error",
            "number",
            "Mean distance from the gold score; meaningful when both use one scale.",
        ),
    ],
    "categorical": [
        (
            "accuracy",
            "Accuracy",
            "percent",
            "Share of gold items on which it gives the gold label.",
        ),
        (
            "kappa",
            "Cohen's κ",
            "decimal",
            "Agreement with the gold beyond chance: 0 is chance, 1 perfect.",
        ),
    ],
}
HEADLINES = {
    "binary": ("kappa", "f1"),
    "numeric": ("spearman", "mae"),
    "categorical": ("kappa", "accuracy"),
}


def _reliability_context(evaluator) -> dict:
    """The evaluator's records by revision (newest first), and the pairings measured on more
    than one revision, side by side."""
    records = (
        ReliabilityRecord.objects.filter(revision__evaluator=evaluator)
        .select_related("revision", "gold_evaluator")
        .order_by("-revision__version", "gold_evaluator__slug", "gold_field", "output_field")
    )
    revisions: dict[int, dict] = {}
    pairings: dict[str, list[dict]] = {}
    for record in records:
        shown = _record_shown(record)
        revisions.setdefault(
            record.revision_id,
            {
                "revision": record.revision,
                "head": record.revision_id == evaluator.head_id,
                "records": [],
            },
        )["records"].append(shown)
        pairings.setdefault(shown["pairing"], []).append(shown)
    return {
        "reliability": list(revisions.values()),
        "reliability_head_measured": evaluator.head_id in revisions,
        "reliability_comparisons": [
            {"pairing": name, "headers": [f["label"] for f in rows[0]["headline"]], "rows": rows}
            for name, rows in pairings.items()
            if len(rows) > 1
        ],
        "few_gold_items": FEW_GOLD_ITEMS,
    }


def _record_shown(record: ReliabilityRecord) -> dict:
    figures = record.figures or {}
    shown = {
        key: {"label": label, "help": help_text, **_figure_shown(figures.get(key), style)}
        for key, label, style, help_text in FIGURES.get(record.type, [])
    }
    consistency = figures.get("consistency") or {}
    return {
        "record": record,
        "pairing": f"{record.gold_evaluator.slug}.{record.gold_field} vs {record.output_field}",
        "type": record.type,
        "items": record.items,
        "few": record.items < FEW_GOLD_ITEMS,
        "figures": list(shown.values()),
        "headline": [shown[key] for key in HEADLINES.get(record.type, ()) if key in shown],
        "confusion": _confusion(record.type, figures),
        "consistency": {
            "items": consistency["items"],
            "stable": _figure_shown(consistency.get("stable"), "percent"),
            "flip_rate": _figure_shown(consistency.get("flip_rate"), "percent"),
        }
        if consistency.get("items")
        else None,
    }


def _confusion(record_type: str, figures: dict) -> dict | None:
    """Rows gold, columns predicted."""
    cells = figures.get("confusion")
    if record_type == "binary" and cells:
        return {
            "corner": "",
            "labels": ["it passes", "it fails"],
            "rows": [
                ("gold pass", [cells["tp"], cells["fn"]]),
                ("gold fail", [cells["fp"], cells["tn"]]),
            ],
        }
    if record_type == "categorical" and cells:
        labels = [str(label) for label in figures.get("labels") or []]
        return {
            "corner": "gold ↓ · it says →",
            "labels": labels,
            "rows": list(zip(labels, cells, strict=False)),
        }
    return None


def _figure_shown(figure: dict | None, style: str) -> dict:
    """A value and its interval as printed: percentages ("83%", interval "55-95%" with an en
    dash), decimals ("0.71", interval "0.32, 0.95"), or a dash where the figure is undefined."""
    value, ci = (figure or {}).get("value"), (figure or {}).get("ci")
    if value is None:
        return {"value": "—", "ci": "", "undefined": True}
    if style == "percent":
        return {
            "value": f"{value * 100:.0f}%",
            "ci": f"{ci[0] * 100:.0f}–{ci[1] * 100:.0f}%" if ci else "",
        }
    text = "{:.2f}" if style == "decimal" else "{:.3g}"
    return {
        "value": text.format(value),
        "ci": f"{text.format(ci[0])}, {text.format(ci[1])}" if ci else "",
    }


def _code_context(kind, revision=None, examples_form=None) -> dict:
    """What the code editor adds: sandbox health, runtime defaults, the example cases."""
    report = revision.examples_report if revision else []
    passed = sum(1 for case in report if case.get("passed"))
    return {
        "sandbox": sandbox_status(),
        "default_code": DEFAULT_CODE,
        "examples_form": examples_form or ExamplesForm.for_revision(revision),
        "examples_report": report,
        "examples_passed": passed,
        "examples_failed": sum(1 for case in report if case.get("passed") is False),
        "examples_not_run": sum(1 for case in report if case.get("passed") is None),
        "examples_max": settings.EVALSITE_EXAMPLES_MAX,
        "examples_seconds": f"{settings.EVALSITE_EXAMPLES_SECONDS:g}",
    }


def _sample_for(kind, request=None, project=None) -> dict:
    """The playground's starting case: a scenario the user came from (the drill-in's link), else
    a realistic sample for the kind."""
    case = (sample_from_request(request, project) if request is not None else None) or sample_case(
        kind
    )
    return {key: json.dumps(value, indent=2) for key, value in case.items()}


@require_POST
@project_view()
def evaluator_save(request, project, ref):
    """Save the settings form (and example cases) as a new revision; nothing is saved when
    validation, the kind's check (a syntax error) or the example cases' format fails."""
    evaluator = _evaluator_or_404(project, ref)
    kind = kind_resolve(evaluator.kind)
    settings_form = SettingsForm(kind, request.POST, initial_parameters=evaluator.head.parameters)
    message_form = RevisionMessageForm(request.POST)
    examples_form = ExamplesForm(request.POST)
    if all([settings_form.is_valid(), message_form.is_valid(), examples_form.is_valid()]):
        try:
            revision = evaluator_revise(
                evaluator=evaluator,
                parameters=settings_form.cleaned_parameters,
                examples=examples_form.cleaned_data["examples"],
                author=request.user,
                message=message_form.cleaned_data["message"],
            )
        except InvalidInput as exc:
            _errors_onto(exc, settings_form, examples_form)
        else:
            if revision is None:
                messages.info(request, "Nothing changed; no new revision.")
            else:
                messages.success(request, f"Saved as {revision.slug}.")
            return redirect("evaluator-detail", project.slug, evaluator.slug)
    context = _detail_context(
        request, project, evaluator, kind, settings_form, message_form, examples_form=examples_form
    )
    return render(request, "evaluators/detail.html", context, status=400)


@require_POST
@project_view()
def evaluator_archive(request, project, ref):
    evaluator = _evaluator_or_404(project, ref)
    evaluator_revise(evaluator=evaluator, archived=not evaluator.archived, author=request.user)
    messages.success(
        request, f"{evaluator.name} {'restored' if evaluator.archived else 'archived'}."
    )
    return redirect("evaluator-detail", project.slug, evaluator.slug)


@project_view()
def evaluator_try(request, project, ref):
    """Run the head revision on a sample, or the unsaved settings when the form sends them.

    Trying saves nothing but runs the evaluator (code, a model, a webhook): editors only.
    """
    evaluator = _evaluator_or_404(project, ref)
    kind = kind_resolve(evaluator.kind)
    playground, status = _try(request, project, kind, revision=evaluator.head)
    if request.htmx:
        context = {
            "project": project,
            "evaluator": evaluator,
            "kind": kind,
            "try_url": request.path,
            "can_edit": request.role in ("editor", "owner"),
        }
        return render(
            request, "evaluators/detail.html#try-panel", context | playground, status=status
        )
    settings_form = SettingsForm(kind, initial_parameters=evaluator.head.parameters)
    full = _detail_context(request, project, evaluator, kind, settings_form)
    return render(request, "evaluators/detail.html", full | playground, status=status)


def _try(request, project, kind, *, revision=None, parameters=None) -> tuple[dict, int]:
    """One playground run: its template context (``try_form``, ``result``, ``ran``) and status.

    Settings sent along (``p__*`` fields: the unsaved editor) win over the revision or
    ``parameters``.
    """
    form = TryForm(request.POST or None)
    draft = draft_parameters = None
    if any(key.startswith(PREFIX) for key in request.POST):
        base = revision.parameters if revision else parameters
        draft = SettingsForm(kind, request.POST, initial_parameters=base)
        if not draft.is_valid():
            form.add_error(None, f"Fix the settings before trying them: {_problems(draft)}")
        else:
            draft_parameters = _draft_sealed(form, kind, draft, base)
    result = ran = None
    if request.method == "POST" and form.is_valid():
        if draft is not None:
            config = {"kind": kind.key, "parameters": draft_parameters}
        elif revision is not None:
            config = {"revision": revision}
        else:
            config = {"kind": kind.key, "parameters": parameters}
        try:
            result = evaluation_invoke(
                inputs=form.cleaned_data["inputs"],
                outputs=form.cleaned_data["outputs"],
                trace=form.cleaned_data["trace"],
                session=form.cleaned_data.get("session"),
                project=project,
                **config,
            )
        except Busy as exc:
            form.add_error(None, exc.fields["non_field_errors"][0])
            return {"try_form": form, "result": None, "ran": None}, exc.status
        ran = "draft" if draft is not None else (revision.slug if revision else "defaults")
    status = 400 if request.method == "POST" and not form.is_valid() else 200
    return {"try_form": form, "result": result, "ran": ran}, status


def _draft_sealed(form, kind, draft, stored) -> dict | None:
    """The draft's parameters; it shows sealed values as MASK, which stand for the stored ones."""
    try:
        return parameters_seal(kind, draft.cleaned_parameters, stored=stored)
    except InvalidInput as exc:
        form.add_error(None, f"Fix the settings before trying them: {exc}")
        return None


def _problems(form) -> str:
    return "; ".join(
        f"{form[name].label if name in form.fields else 'settings'}: {' '.join(errors)}"
        for name, errors in form.errors.items()
    )


@project_view()
def evaluator_diff(request, project, ref):
    evaluator = _evaluator_or_404(project, ref)
    by_version = {r.version: r for r in evaluator.revisions.all()}
    try:
        a = by_version[int(request.GET.get("a", 0))]
        b = by_version[int(request.GET.get("b", 0))]
    except (KeyError, ValueError):
        raise Http404("Pick two revisions of this evaluator.")
    shown_a, shown_b = parameters_diffable(evaluator.kind, a.parameters, b.parameters)
    lines = list(
        difflib.unified_diff(
            json.dumps(shown_a, indent=2, sort_keys=True, ensure_ascii=False).splitlines(),
            json.dumps(shown_b, indent=2, sort_keys=True, ensure_ascii=False).splitlines(),
            fromfile=a.slug,
            tofile=b.slug,
            lineterm="",
        )
    )
    context = {"project": project, "evaluator": evaluator, "a": a, "b": b, "diff_lines": lines}
    template = "evaluators/diff.html#revision-diff" if request.htmx else "evaluators/diff.html"
    return render(request, template, context)
