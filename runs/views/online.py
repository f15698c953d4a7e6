"""Online evaluation pages: the rules, a new-rule form, and a rule's page (its live run, metrics
by time bucket, pause/resume, backfill with progress)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from django import forms
from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_POST

from evalsite.errors import InvalidInput
from evalsite.views import project_view
from evaluators.kinds import REGISTRY
from evaluators.models import Evaluator
from runs import metrics, online, selectors
from runs.models import OnlineRule, RuleTarget

RECENT = 20


def _local_input() -> forms.DateTimeInput:
    # What <input type="datetime-local"> accepts (no seconds, a T, no zone; UTC here).
    return forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


# --- forms --------------------------------------------------------------------------------------


def _attributes_parse(text: str) -> dict[str, str]:
    conditions = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        path_, sep, value = line.partition("=")
        if not sep or not path_.strip():
            raise forms.ValidationError(f"Line {number}: write path=value, e.g. ag.meta.env=prod")
        conditions[path_.strip()] = value.strip()
    return conditions


class RuleForm(forms.Form):
    name = forms.CharField(max_length=200)
    target = forms.ChoiceField(
        choices=[
            (RuleTarget.TRACE, "Each trace, a few seconds after it arrives"),
            (RuleTarget.SESSION, "Each session, once it has been idle (the whole conversation)"),
        ],
        initial=RuleTarget.TRACE,
        required=False,
        widget=forms.RadioSelect,
        label="Evaluate",
        help_text="Session rules need an evaluator that judges sessions.",
    )
    idle_seconds = forms.IntegerField(
        required=False,
        min_value=online.IDLE_MIN_SECONDS,
        max_value=online.IDLE_MAX_SECONDS,
        initial=online.IDLE_DEFAULT_SECONDS,
        label="Idle time (seconds)",
        help_text="Session rules: a session is judged once nothing of it arrived this long "
        "(900 = 15 min), and again if it resumes.",
    )
    evaluator = forms.ModelChoiceField(
        queryset=Evaluator.objects.none(),
        empty_label="Choose an evaluator",
        help_text="Its newest revision. Human and feedback evaluators do not run, so they are not listed.",
    )
    root_name = forms.CharField(
        max_length=300,
        required=False,
        label="Root span name",
        help_text="Exactly; empty matches any.",
    )
    attributes = forms.CharField(
        required=False,
        widget=forms.Textarea(
            attrs={"rows": 3, "class": "mono", "placeholder": "ag.meta.env=prod"}
        ),
        help_text="One path=value per line; a trace matches when any of its spans has the value.",
    )
    since = forms.DateTimeField(
        required=False,
        widget=_local_input(),
        help_text="UTC; optional.",
    )
    until = forms.DateTimeField(
        required=False,
        widget=_local_input(),
        help_text="UTC; optional.",
    )
    sampling_percent = forms.FloatField(
        min_value=0.01,
        max_value=100,
        initial=100,
        label="Sample (%)",
        help_text="Decided by the trace id: the same trace is always in or always out.",
    )
    bucket_seconds = forms.TypedChoiceField(
        choices=online.BUCKET_CHOICES, coerce=int, initial=3600, label="Metrics per"
    )

    field_order = ["name", "evaluator", "target", "idle_seconds"]

    def __init__(self, project, *args, rule: OnlineRule | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if rule is not None:
            # Fixed for the rule's life: its live run depends on them.
            del self.fields["evaluator"], self.fields["target"]
            if not rule.for_sessions:
                del self.fields["idle_seconds"]
        else:
            silent = [key for key, kind in REGISTRY.items() if not kind.executes]
            self.fields["evaluator"].queryset = (
                Evaluator.objects.for_project(project)
                .active()
                .exclude(kind__in=silent)
                .filter(head__isnull=False)
            )

    def clean_attributes(self):
        return _attributes_parse(self.cleaned_data.get("attributes") or "")

    def rule_filter(self) -> dict:
        data = self.cleaned_data
        return {
            "name": data["root_name"],
            "attributes": data["attributes"],
            "since": data["since"].isoformat() if data["since"] else None,
            "until": data["until"].isoformat() if data["until"] else None,
        }

    @staticmethod
    def initial_for(rule: OnlineRule) -> dict:
        found = rule.filter or {}
        return {
            "name": rule.name,
            "root_name": found.get("name", ""),
            "attributes": "\n".join(
                f"{path_}={value if isinstance(value, str) else json.dumps(value)}"
                for path_, value in (found.get("attributes") or {}).items()
            ),
            "since": _datetime(found.get("since")),
            "until": _datetime(found.get("until")),
            "sampling_percent": round(rule.sampling_rate * 100, 4),
            "bucket_seconds": rule.bucket_seconds,
            "idle_seconds": rule.idle_seconds,
        }


def _datetime(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


class BackfillForm(forms.Form):
    since = forms.DateTimeField(widget=_local_input(), help_text="UTC.")
    until = forms.DateTimeField(
        required=False,
        widget=_local_input(),
        help_text="UTC; empty: now.",
    )


def _form_errors(form: forms.Form, exc: InvalidInput) -> None:
    aliases = {
        "sampling_rate": "sampling_percent",
        "filter.name": "root_name",
        "revision": "evaluator",
    }
    for field, reasons in exc.fields.items():
        name = aliases.get(field, field.removeprefix("filter."))
        form.add_error(name if name in form.fields else None, f"{reasons[0]}")


# --- list and new -------------------------------------------------------------------------------


@project_view()
def online_rule_list(request, project):
    state = request.GET.get("state", "")
    rules = OnlineRule.objects.for_project(project).select_related("run", "revision__evaluator")
    if state in ("active", "paused"):
        rules = rules.filter(active=state == "active")
    if request.GET.get("q"):
        rules = rules.filter(name__icontains=request.GET["q"])
    rules = list(rules)
    for rule in rules:
        rule.sample_percent = rule.sampling_rate * 100
    context = {"project": project, "rules": rules, "state": state, "q": request.GET.get("q", "")}
    template = (
        "runs/online/list.html#online-rule-table" if request.htmx else "runs/online/list.html"
    )
    return render(request, template, context)


@project_view()
def online_rule_new(request, project):
    form = RuleForm(
        project, request.POST or None, initial={"evaluator": request.GET.get("evaluator")}
    )
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            rule = online.online_rule_create(
                project=project,
                name=data["name"],
                revision=data["evaluator"].head,
                filter=form.rule_filter(),
                sampling_rate=data["sampling_percent"] / 100,
                bucket_seconds=data["bucket_seconds"],
                target=data["target"] or RuleTarget.TRACE,
                idle_seconds=data["idle_seconds"] or online.IDLE_DEFAULT_SECONDS,
                author=request.user,
            )
        except InvalidInput as exc:
            _form_errors(form, exc)
        else:
            what = "sessions are judged once idle" if rule.for_sessions else "traces are evaluated"
            messages.success(request, f"Rule {rule.name} is live: new matching {what}.")
            return redirect("online-rule-detail", project.slug, rule.pk)
    status = 400 if form.errors else 200
    return render(
        request, "runs/online/new.html", {"project": project, "form": form}, status=status
    )


# --- one rule -----------------------------------------------------------------------------------


def _rule_or_404(project, rule_id) -> OnlineRule:
    rule = (
        OnlineRule.objects.for_project(project)
        .select_related("run", "revision__evaluator")
        .filter(pk=rule_id)
        .first()
    )
    if rule is None:
        raise Http404("No such rule.")
    return rule


def _columns(rule: OnlineRule) -> list[dict]:
    """The evaluator's metrics: name, step key, key inside the outputs, type."""
    if rule.run is None:
        return []
    return [
        {
            "name": m["column"]["name"],
            "step": m["step"]["key"],
            "key": m["step"]["path"].removeprefix(metrics.OUTPUTS_PREFIX + "."),
            "type": m["column"].get("type", ""),
        }
        for m in rule.run.mappings
        if m["column"]["kind"] == "annotation"
    ]


def _headline(stats: dict | None) -> dict:
    """One number for a metric: a rate for binary, a mean for numbers, a count otherwise."""
    stats = stats or {}
    if stats.get("type") == "binary":
        return {"value": stats.get("rate"), "format": "percent", "n": stats.get("count", 0)}
    if stats.get("type") in ("continuous", "discrete"):
        return {"value": stats.get("mean"), "format": "number", "n": stats.get("count", 0)}
    return {"value": stats.get("count"), "format": "count", "n": stats.get("count", 0)}


def _bucket_rows(rule: OnlineRule, columns: list[dict]) -> list[dict]:
    rows = []
    for bucket in online.online_buckets(rule=rule):
        data = bucket["data"]
        step = data.get(columns[0]["step"], {}) if columns else {}
        rows.append(
            {
                "start": bucket["start"],
                "end": bucket["end"],
                "evaluated": (step.get("duration") or {}).get("count", 0),
                "errors": (step.get("errors") or {}).get("count", 0),
                "values": [_headline(data.get(c["step"], {}).get(c["key"])) for c in columns],
            }
        )
    return rows


def _chart(rule: OnlineRule, columns: list[dict], rows: list[dict]) -> str:
    if not columns or len(rows) < 2:
        return ""
    first = columns[0]
    fmt = "%H:%M" if rule.bucket_seconds < 86400 else "%Y-%m-%d"
    config = {
        "type": "line",
        "labels": [row["start"].strftime(fmt) for row in rows],
        "data": [row["values"][0]["value"] for row in rows],
        "label": first["name"],
        "format": "percent" if first["type"] == "binary" else "number",
    }
    return json.dumps(config)


def _detail_context(request, project, rule: OnlineRule, backfill_form=None) -> dict:
    columns = _columns(rule)
    run = rule.run
    overall = {}
    if run is not None:
        row = run.metrics.filter(scenario=None, bucket_start=None).first()
        overall = row.data if row else {}
    rows = _bucket_rows(rule, columns)
    recent = (
        list(run.scenarios.select_related("trace", "session").order_by("-id")[:RECENT])
        if run
        else []
    )
    now = timezone.now().replace(second=0, microsecond=0)
    return {
        "project": project,
        "rule": rule,
        "run": run,
        "can_edit": request.role in ("editor", "owner"),
        "columns": columns,
        "cards": [
            {
                **c,
                **_headline(overall.get(c["step"], {}).get(c["key"])),
                "errors": overall.get(c["step"], {}).get("errors", {}).get("count", 0),
            }
            for c in columns
        ],
        "buckets": rows,
        "chart": _chart(rule, columns, rows),
        "recent": selectors.scenario_rows(run, recent) if run else [],
        "backfill": online.online_backfill_progress(rule=rule),
        "backfill_form": backfill_form
        or BackfillForm(initial={"since": now - timedelta(hours=24), "until": now}),
        "sample_percent": rule.sampling_rate * 100,
        "unit": "session" if rule.for_sessions else "trace",
        "bucket_label": dict(online.BUCKET_CHOICES).get(rule.bucket_seconds)
        or f"{rule.bucket_seconds} seconds",
    }


REGIONS = ("online-backfill", "online-buckets")


@project_view()
def online_rule_detail(request, project, rule_id):
    rule = _rule_or_404(project, rule_id)
    context = _detail_context(request, project, rule)
    region = request.GET.get("region")
    if request.htmx and region in REGIONS:
        return render(request, f"runs/online/detail.html#{region}", context)
    return render(request, "runs/online/detail.html", context)


@project_view()
def online_rule_edit(request, project, rule_id):
    rule = _rule_or_404(project, rule_id)
    form = RuleForm(project, request.POST or None, rule=rule, initial=RuleForm.initial_for(rule))
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            online.online_rule_update(
                rule=rule,
                name=data["name"],
                filter=form.rule_filter(),
                sampling_rate=data["sampling_percent"] / 100,
                bucket_seconds=data["bucket_seconds"],
                idle_seconds=data.get("idle_seconds"),
            )
        except InvalidInput as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, "Rule saved; it applies to traces from now on.")
            return redirect("online-rule-detail", project.slug, rule.pk)
    status = 400 if form.errors else 200
    context = {"project": project, "form": form, "rule": rule}
    return render(request, "runs/online/new.html", context, status=status)


@require_POST
@project_view()
def online_rule_pause(request, project, rule_id):
    rule = online.online_rule_pause(
        rule=_rule_or_404(project, rule_id),
        reason=request.POST.get("reason") or f"Paused by {request.user.get_username()}.",
    )
    messages.success(request, f"Rule {rule.name} paused: it evaluates nothing until resumed.")
    return redirect("online-rule-detail", project.slug, rule.pk)


@require_POST
@project_view()
def online_rule_resume(request, project, rule_id):
    rule = online.online_rule_resume(rule=_rule_or_404(project, rule_id))
    messages.success(request, f"Rule {rule.name} resumed. Backfill to catch up on the pause.")
    return redirect("online-rule-detail", project.slug, rule.pk)


@require_POST
@project_view()
def online_rule_backfill(request, project, rule_id):
    rule = _rule_or_404(project, rule_id)
    form = BackfillForm(request.POST)
    if form.is_valid():
        try:
            progress = online.online_backfill(rule=rule, **form.cleaned_data)
        except InvalidInput as exc:
            messages.error(request, next(iter(exc.fields.values()))[0])
        else:
            unit = "sessions" if rule.for_sessions else "traces"
            messages.success(
                request,
                f"Backfill queued: {progress['queued']} of {progress['total']} matching {unit} "
                "still to evaluate.",
            )
        return redirect("online-rule-detail", project.slug, rule.pk)
    context = _detail_context(request, project, rule, backfill_form=form)
    return render(request, "runs/online/detail.html", context, status=400)


@require_POST
@project_view()
def online_rule_delete(request, project, rule_id):
    rule = _rule_or_404(project, rule_id)
    online.online_rule_delete(rule=rule)
    messages.success(request, f"Rule {rule.name} deleted; its run is kept, closed.")
    return redirect("online-rule-list", project.slug)


urlpatterns = [
    path("online/", online_rule_list, name="online-rule-list"),
    path("online/new", online_rule_new, name="online-rule-new"),
    path("online/<int:rule_id>/", online_rule_detail, name="online-rule-detail"),
    path("online/<int:rule_id>/edit", online_rule_edit, name="online-rule-edit"),
    path("online/<int:rule_id>/pause", online_rule_pause, name="online-rule-pause"),
    path("online/<int:rule_id>/resume", online_rule_resume, name="online-rule-resume"),
    path("online/<int:rule_id>/backfill", online_rule_backfill, name="online-rule-backfill"),
    path("online/<int:rule_id>/delete", online_rule_delete, name="online-rule-delete"),
]
