"""Evaluator pages: list, new (kind, then preset), detail with settings, history, diff, try it."""

from __future__ import annotations

import difflib
import json

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators import selectors
from evaluators.forms import PREFIX, EvaluatorMetaForm, RevisionMessageForm, SettingsForm, TryForm
from evaluators.kinds import REGISTRY
from evaluators.models import Preset
from evaluators.services import evaluation_invoke, evaluator_create, evaluator_revise, kind_resolve


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
    """Step 1 picks a kind; step 2 (``?kind=``) an optional preset, a name and the settings."""
    kind_key = request.GET.get("kind") or request.POST.get("kind")
    if not kind_key:
        kinds = sorted(REGISTRY.values(), key=lambda k: (k.category, k.name))
        return render(request, "evaluators/new_kind.html", {"project": project, "kinds": kinds})
    try:
        kind = kind_resolve(kind_key)
    except InvalidInput:
        raise Http404("Unknown kind.")
    preset_slug = request.GET.get("preset", "")
    presets = Preset.objects.filter(kind=kind.key, project__isnull=True) | Preset.objects.filter(
        kind=kind.key, project=project
    )
    preset = presets.filter(slug=preset_slug).first() if preset_slug else None
    initial = dict(preset.parameters) if preset else {}
    if request.method == "POST":
        meta = EvaluatorMetaForm(request.POST)
        settings_form = SettingsForm(kind, request.POST, initial_parameters=initial)
        if meta.is_valid() and settings_form.is_valid():
            try:
                evaluator = evaluator_create(
                    project=project,
                    kind=kind.key,
                    author=request.user,
                    parameters=settings_form.cleaned_parameters,
                    **meta.cleaned_data,
                )
            except InvalidInput as exc:
                _errors_onto(exc, meta, settings_form)
            else:
                messages.success(request, f"Evaluator {evaluator.name} created.")
                return redirect("evaluator-detail", project.slug, evaluator.slug)
    else:
        name = preset.name if preset else kind.name
        meta = EvaluatorMetaForm(initial={"name": name})
        settings_form = SettingsForm(kind, initial_parameters=initial)
    context = {
        "project": project,
        "kind": kind,
        "presets": presets.order_by("name"),
        "preset": preset,
        "meta": meta,
        "settings_form": settings_form,
    }
    return render(request, "evaluators/new.html", context)


def _errors_onto(exc: InvalidInput, meta, settings_form) -> None:
    for field, reasons in exc.fields.items():
        for reason in reasons:
            if field in meta.fields:
                meta.add_error(field, reason)
            else:
                settings_form.add_error(None, f"{field}: {reason}")


def _evaluator_or_404(project, ref):
    evaluator = selectors.evaluator_get(project=project, ref=ref)
    if evaluator is None:
        raise Http404("No such evaluator.")
    return evaluator


@project_view()
def evaluator_detail(request, project, ref):
    evaluator = _evaluator_or_404(project, ref)
    kind = kind_resolve(evaluator.kind)
    head = evaluator.head
    settings_form = SettingsForm(kind, initial_parameters=head.parameters if head else {})
    return render(
        request,
        "evaluators/detail.html",
        _detail_context(request, project, evaluator, kind, settings_form),
    )


def _detail_context(
    request, project, evaluator, kind, settings_form, message_form=None, try_form=None
):
    revisions = list(evaluator.revisions.select_related("author"))
    return {
        "project": project,
        "evaluator": evaluator,
        "kind": kind,
        "settings_form": settings_form,
        "message_form": message_form or RevisionMessageForm(),
        "try_form": try_form or TryForm(initial=_sample_for(kind)),
        "revisions": revisions,
        "can_edit": request.role in ("editor", "owner"),
        "outputs_schema": json.dumps((evaluator.head.schemas or {}).get("outputs"), indent=2)
        if evaluator.head
        else "null",
    }


def _sample_for(kind) -> dict:
    from evaluators.samples import sample_case

    case = sample_case(kind)
    return {key: json.dumps(value, indent=2) for key, value in case.items()}


@require_POST
@project_view()
def evaluator_save(request, project, ref):
    """Save the settings form as a new revision (nothing is saved when validation fails)."""
    evaluator = _evaluator_or_404(project, ref)
    kind = kind_resolve(evaluator.kind)
    settings_form = SettingsForm(kind, request.POST, initial_parameters=evaluator.head.parameters)
    message_form = RevisionMessageForm(request.POST)
    if settings_form.is_valid() and message_form.is_valid():
        try:
            revision = evaluator_revise(
                evaluator=evaluator,
                parameters=settings_form.cleaned_parameters,
                author=request.user,
                message=message_form.cleaned_data["message"],
            )
        except InvalidInput as exc:
            for field, reasons in exc.fields.items():
                settings_form.add_error(None, f"{field}: {reasons[0]}")
        else:
            if revision is None:
                messages.info(request, "Nothing changed; no new revision.")
            else:
                messages.success(request, f"Saved as {revision.slug}.")
            return redirect("evaluator-detail", project.slug, evaluator.slug)
    context = _detail_context(request, project, evaluator, kind, settings_form, message_form)
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


@project_view(write_role="viewer")
def evaluator_try(request, project, ref):
    """Run the head revision on a sample, or the unsaved settings when the form sends them.

    Trying changes nothing, so viewers may do it too.
    """
    evaluator = _evaluator_or_404(project, ref)
    form = TryForm(request.POST or None)
    result = None
    kind = kind_resolve(evaluator.kind)
    draft = None
    if any(key.startswith(PREFIX) for key in request.POST):
        draft = SettingsForm(kind, request.POST, initial_parameters=evaluator.head.parameters)
    if request.method == "POST" and form.is_valid() and (draft is None or draft.is_valid()):
        config = (
            {"kind": kind.key, "parameters": draft.cleaned_parameters}
            if draft is not None
            else {"revision": evaluator.head}
        )
        result = evaluation_invoke(
            inputs=form.cleaned_data["inputs"],
            outputs=form.cleaned_data["outputs"],
            trace=form.cleaned_data["trace"],
            project=project,
            **config,
        )
    if draft is not None and not draft.is_valid():
        form.add_error(None, "Fix the settings above before trying them.")
    context = {"project": project, "evaluator": evaluator, "try_form": form, "result": result}
    status = 400 if request.method == "POST" and not form.is_valid() else 200
    if request.htmx:
        return render(request, "evaluators/detail.html#try-panel", context, status=status)
    full = _detail_context(
        request,
        project,
        evaluator,
        kind,
        SettingsForm(kind, initial_parameters=evaluator.head.parameters),
        try_form=form,
    )
    return render(request, "evaluators/detail.html", full | {"result": result}, status=status)


@project_view()
def evaluator_diff(request, project, ref):
    evaluator = _evaluator_or_404(project, ref)
    by_version = {r.version: r for r in evaluator.revisions.all()}
    try:
        a = by_version[int(request.GET.get("a", 0))]
        b = by_version[int(request.GET.get("b", 0))]
    except (KeyError, ValueError):
        raise Http404("Pick two revisions of this evaluator.")
    lines = list(
        difflib.unified_diff(
            json.dumps(a.parameters, indent=2, sort_keys=True).splitlines(),
            json.dumps(b.parameters, indent=2, sort_keys=True).splitlines(),
            fromfile=a.slug,
            tofile=b.slug,
            lineterm="",
        )
    )
    context = {"project": project, "evaluator": evaluator, "a": a, "b": b, "diff_lines": lines}
    template = "evaluators/diff.html#revision-diff" if request.htmx else "evaluators/diff.html"
    return render(request, template, context)
