"""Run pages: list with live progress, the new-run form, the run page, applications."""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from evalsite.templatetags.evalsite_tags import cell_value
from evalsite.views import project_view
from evaluators.models import Evaluator
from runs import engine, metrics, review, selectors
from runs.applications import application_create
from runs.models import Application, Run, RunStatus, Testset
from runs.views.reliability import corrected_for

# --- list -------------------------------------------------------------------------------------


@project_view()
def run_list(request, project):
    status = request.GET.get("status", "")
    # One tag a parameter (a tag's link, the box): its value may hold commas and colons.
    tag_params = [t.strip() for t in request.GET.getlist("tag") if t.strip()]
    tag = tag_params[0] if tag_params else ""
    tag_error = ""
    try:
        tags = engine.tag_filters_parse(tag_params)
    except InvalidInput as exc:
        tags, tag_error = {}, next(iter(exc.fields.values()))[0]
    runs = selectors.run_list(
        project=project, status=status, search=request.GET.get("q", ""), tags=tags
    ).filter(is_online=False)
    page = Paginator(runs, 25).get_page(request.GET.get("page"))
    context = {
        "project": project,
        "page": page,
        "status": status,
        "tag": tag,
        "tag_error": tag_error,
        "q": request.GET.get("q", ""),
        "statuses": RunStatus.choices,
        "polling": any(run.is_active for run in page),
    }
    template = "runs/list.html#run-table" if request.htmx else "runs/list.html"
    return render(request, template, context)


# --- new ----------------------------------------------------------------------------------------


class RunForm(forms.Form):
    name = forms.CharField(
        max_length=200, required=False, help_text="Defaults to testset × application."
    )
    testset = forms.ModelChoiceField(
        queryset=Testset.objects.none(), empty_label="Choose a testset"
    )
    application = forms.ModelChoiceField(
        queryset=Application.objects.none(),
        required=False,
        empty_label="— outputs from a column —",
        help_text="What is evaluated. Leave empty to read outputs from a testset column.",
    )
    outputs_column = forms.CharField(
        max_length=200,
        required=False,
        initial="outputs",
        help_text="With no application: the testset column that holds the outputs.",
    )
    evaluators = forms.ModelMultipleChoiceField(
        queryset=Evaluator.objects.none(),
        widget=forms.CheckboxSelectMultiple,
        required=False,
        help_text="Each runs at its newest revision.",
    )
    repeats = forms.IntegerField(
        min_value=1,
        max_value=20,
        initial=1,
        help_text="Invoke and evaluate each row this many times.",
    )
    tags = forms.CharField(
        max_length=2000,
        required=False,
        help_text="Labels to find the run by: branch=main, commit=9f1c2e7, pr=482.",
    )
    max_cost_usd = forms.DecimalField(
        label="Spend cap (USD)",
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=4,
        help_text="Refuse the run up front if its judges are projected to cost more.",
    )

    def __init__(self, project, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project
        self.fields["testset"].queryset = Testset.objects.for_project(project).filter(
            head__isnull=False
        )
        self.fields["application"].queryset = Application.objects.for_project(project).exclude(
            kind=Application.Kind.LOGGED
        )
        self.fields["evaluators"].queryset = (
            Evaluator.objects.for_project(project).active().exclude(kind__in=("human", "feedback"))
        )

    def clean_tags(self):
        try:
            return engine.tags_validate(engine.tags_text_parse(self.cleaned_data["tags"]))
        except InvalidInput as exc:
            raise forms.ValidationError(next(iter(exc.fields.values()))[0])

    def clean(self):
        data = super().clean()
        if not data.get("application") and not data.get("outputs_column"):
            self.add_error("outputs_column", "Choose an application or name the outputs column.")
        return data

    def estimate(self) -> dict:
        """The run's projection, as the API's dry_run answers it (creates nothing: a column
        application still to be created is stood in for by an unsaved one)."""
        data, choice = self.cleaned_data, self.application_choice()
        application = choice.get("application") or Application(
            project=self.project, **choice["new_application"]
        )
        return engine.run_estimate(
            project=self.project,
            testset_version=data["testset"].head,
            application=application,
            revisions=[e.head for e in data["evaluators"]],
            repeats=data["repeats"],
            max_cost_usd=data.get("max_cost_usd"),
        )

    def application_choice(self) -> dict:
        """``application=`` an existing one, or ``new_application=`` a column application that
        ``run_submit`` creates inside the run's own transaction."""
        if self.cleaned_data.get("application"):
            return {"application": self.cleaned_data["application"]}
        column = self.cleaned_data["outputs_column"]
        slug = f"column-{column}"[:100].lower().replace("_", "-").replace(" ", "-")
        existing = Application.objects.filter(project=self.project, slug=slug).first()
        if existing:
            return {"application": existing}
        new = {"name": f"Column {column}", "slug": slug, "kind": "column"}
        return {"new_application": {**new, "config": {"outputs_column": column}}}


@project_view()
def run_new(request, project):
    form = RunForm(project, request.POST or None, initial={"testset": request.GET.get("testset")})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            run = engine.run_submit(
                project=project,
                name=data["name"],
                testset_version=data["testset"].head,
                revisions=[e.head for e in data["evaluators"]],
                repeats=data["repeats"],
                author=request.user,
                tags=data["tags"],
                max_cost_usd=data.get("max_cost_usd"),
                **form.application_choice(),
            )
        except InvalidInput as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Run {run.name} queued.")
            return redirect("run-detail", project.slug, run.pk)
    return render(request, "runs/new.html", {"project": project, "form": form})


@project_view()
@require_POST
def run_estimate(request, project):
    """The new-run form's projection (HTMX swaps it in beside the form; without JavaScript the
    whole page comes back with it): cells per step, calls, tokens, cost and the caps."""
    form = RunForm(project, request.POST)
    estimate = None
    if form.is_valid():
        try:
            estimate = form.estimate()
        except InvalidInput as exc:
            _form_errors(form, exc)
    context = {"project": project, "form": form, "estimate": estimate}
    template = "runs/new.html#estimate" if request.htmx else "runs/new.html"
    return render(request, template, context)


def _form_errors(form, exc: InvalidInput) -> None:
    for field, reasons in exc.fields.items():
        form.add_error(field if field in form.fields else None, reasons[0])


# --- the run page -------------------------------------------------------------------------------


def _run_or_404(project, run_id, *, with_metrics: bool = False) -> Run:
    run = selectors.run_get(project=project, run_id=run_id, with_metrics=with_metrics)
    if run is None:
        raise Http404("No such run.")
    return run


def _cards(run: Run, data: dict, rates: dict) -> list[dict]:
    """One card per evaluator metric, drawn from the stored statistics; a pass rate also
    carries its rate corrected for the evaluator's measured errors (``review.corrected_rates``)."""
    cards = []
    for mapping in run.mappings:
        if mapping["column"]["kind"] != "annotation":
            continue
        key = mapping["step"]["path"].removeprefix(metrics.OUTPUTS_PREFIX + ".")
        stats = data.get(mapping["step"]["key"], {}).get(key)
        if stats:
            cards.append(
                {
                    "name": mapping["column"]["name"],
                    "stats": stats,
                    "chart": _chart(stats),
                    "corrected": corrected_for(rates, mapping["step"]["key"], key)
                    if stats.get("type") == "binary"
                    else [],
                }
            )
    return cards


def _chart(stats: dict) -> str:
    if stats.get("histogram"):
        bins = stats["histogram"]
        config = {
            "type": "bar",
            "labels": [f"{b['start']:.2g}" for b in bins],
            "data": [b["count"] for b in bins],
        }
    elif stats.get("type") == "binary" and stats.get("count"):
        config = {
            "type": "bar",
            "labels": ["true", "false"],
            "data": [stats["true"], stats["false"]],
            "colors": ["success", "failure"],
        }
    elif stats.get("frequencies"):
        config = {
            "type": "bar",
            "labels": [f["value"] for f in stats["frequencies"][:8]],
            "data": [f["count"] for f in stats["frequencies"][:8]],
        }
    else:
        return ""
    return json.dumps(config)


PAGE_SIZE = 50


def _with(params, **changes) -> str:
    """The current query string with some parameters changed (None removes one)."""
    query = params.copy()
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return query.urlencode()


def _table_columns(run: Run, params, query: selectors.TableQuery) -> list[dict]:
    chosen = params.getlist("cols")
    columns = []
    for mapping in run.mappings:
        name, kind = mapping["column"]["name"], mapping["column"]["kind"]
        # Inputs sort in full; metrics through the read model's index (numbers and booleans).
        sortable = kind == "input" or selectors.metric_column(run, name) is not None
        direction = ("desc" if query.desc else "asc") if query.sort == name else ""
        next_sort = f"-{name}" if direction == "asc" else name
        columns.append(
            {
                "name": name,
                "kind": kind,
                "type": mapping["column"].get("type", ""),
                "visible": not chosen or name in chosen,
                "sortable": sortable,
                "ranged": kind == "annotation" and sortable,
                "direction": direction,
                "sort_url": _with(params, sort=next_sort, page=None, cursor=None)
                if sortable
                else "",
            }
        )
    return columns


def _with_cells(rows: list[dict], columns: list[dict]) -> list[dict]:
    """Each row's visible cells, ready to print: an error, a boolean, text (cut to 120
    characters here, cheaper than a filter on every cell), or nothing yet."""
    visible = [c["name"] for c in columns if c["visible"]]
    for row in rows:
        row["cells"] = cells = [cell_value(row, name) for name in visible]
        for cell in cells:
            if len(cell["text"]) > 120:
                cell["text"] = cell["text"][:119] + "…"
    return rows


def _table(request, run: Run) -> dict:
    """The scenario table's context: a page by cursor (``?cursor=``, what its links carry) or
    by number (``?page=N``, older links), its rows and the links either side."""
    params = request.GET
    query = selectors.TableQuery.from_params(params)
    cursor = selectors.Cursor.decode(params["cursor"]) if params.get("cursor") else None
    page_param = params.get("page", "")
    # Nine digits at most: beyond them no run has the page (and int() of thousands refuses).
    number = int(page_param) if page_param.isdecimal() and len(page_param) <= 9 else 1
    page = selectors.table_page(
        run, query, cursor=cursor, offset=max(number - 1, 0) * PAGE_SIZE, limit=PAGE_SIZE
    )
    columns = _table_columns(run, params, query)
    # One reverse() for the page's links to the drill-in, not one a row.
    drill_in = reverse("scenario-detail", args=[request.project.slug, run.pk, 0])
    drill_in = drill_in.removesuffix("0/")
    return {
        "drill_in": drill_in,
        "last_row": page.rank + len(page.scenarios),
        "query": query,
        "columns": columns,
        "visible_columns": [c for c in columns if c["visible"]],
        "metric_columns": [c for c in columns if c["ranged"]],
        "rows": _with_cells(selectors.scenario_rows(run, page.scenarios), columns),
        "page": page,
        "total": page.total,
        **_page_links(params, page),
    }


def _page_links(params, page: selectors.TablePage) -> dict:
    """The Next and Previous links ("?" and their query strings; "" for none). The page before
    the second is the first: a plain link, with no cursor to read back from (and, without
    filters or a sort, an empty query: "?")."""
    links = {"next_url": "", "previous_url": ""}
    if page.next:
        links["next_url"] = "?" + _with(params, cursor=page.next.encode(), page=None)
    if page.previous:
        back = page.previous.encode() if page.previous.rank > PAGE_SIZE else None
        links["previous_url"] = "?" + _with(params, cursor=back, page=None)
    return links


@project_view()
def run_detail(request, project, run_id):
    fragment = bool(request.htmx) and request.htmx.target == "run-scenarios"
    run = _run_or_404(project, run_id, with_metrics=not fragment)
    try:
        table = _table(request, run)
    except InvalidInput as exc:
        return render(request, "400.html", {"message": str(exc)}, status=400)
    can_edit = request.role in ("editor", "owner")
    context = {"project": project, "run": run, "can_edit": can_edit, **table}
    if fragment:
        return render(request, "runs/detail.html#run-scenarios", context)
    data = run.metrics_data or {}
    context |= {
        "cards": _cards(run, data, review.corrected_rates(run)),
        "invocation": next((v for k, v in data.items() if k.startswith("application-")), {}),
        "evaluators": Evaluator.objects.for_project(project)
        .active()
        .exclude(kind__in=("human", "feedback")),
    }
    return render(request, "runs/detail.html", context)


@project_view()
def run_progress(request, project, run_id):
    """The polled header region; when the run has ended it tells htmx to stop polling and
    refresh the page so the metrics appear."""
    run = _run_or_404(project, run_id)
    response = render(request, "runs/detail.html#run-progress", {"project": project, "run": run})
    if request.htmx and not run.is_active and request.GET.get("was") == "active":
        response["HX-Refresh"] = "true"
    return response


def _run_action(service, done: str):
    @require_POST
    @project_view()
    def view(request, project, run_id):
        run = _run_or_404(project, run_id)
        try:
            service(run=run)
        except InvalidInput as exc:
            messages.error(request, next(iter(exc.fields.values()))[0])
        else:
            messages.success(request, done)
        return redirect("run-detail", project.slug, run.pk)

    return view


run_cancel = _run_action(engine.run_cancel, "Run cancelled.")
run_retry = _run_action(engine.run_retry_failed, "Failed cells queued again.")
run_close = _run_action(engine.run_close, "Run closed; it is read-only now.")


@require_POST
@project_view()
def run_metrics_refresh(request, project, run_id):
    engine.run_metrics_refresh_request(run=_run_or_404(project, run_id))
    messages.success(request, "Metrics refresh queued; they update in a few seconds.")
    return redirect("run-detail", project.slug, run_id)


@require_POST
@project_view()
def run_add_evaluator(request, project, run_id):
    run = _run_or_404(project, run_id)
    evaluator = (
        Evaluator.objects.for_project(project).filter(pk=request.POST.get("evaluator") or 0).first()
    )
    if evaluator is None:
        messages.error(request, "Choose an evaluator of this project.")
        return redirect("run-detail", project.slug, run.pk)
    try:
        engine.run_add_evaluators(run=run, revisions=[evaluator.head])
    except InvalidInput as exc:
        messages.error(request, next(iter(exc.fields.values()))[0])
    else:
        messages.success(request, f"{evaluator.name} added; only its cells are computed.")
    return redirect("run-detail", project.slug, run.pk)


# --- applications -------------------------------------------------------------------------------


class ApplicationForm(forms.Form):
    name = forms.CharField(max_length=200)
    kind = forms.ChoiceField(choices=Application.Kind.choices)
    config = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6, "data-editor": "json", "class": "mono"}),
        initial="{}",
        help_text='column: {"outputs_column": "outputs"} · http: {"url": "https://…", "headers": {}, "outputs_path": "outputs"}',
    )

    def clean_config(self):
        try:
            value = jsonsafe.loads(self.cleaned_data["config"] or "{}")
        except ValueError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc}")
        if not isinstance(value, dict):
            raise forms.ValidationError("The configuration must be a JSON object.")
        return value


@project_view()
def application_list(request, project):
    form = ApplicationForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            app = application_create(project=project, **form.cleaned_data)
        except InvalidInput as exc:
            for field, reasons in exc.fields.items():
                form.add_error(
                    "config" if field.startswith("config") else None, f"{field}: {reasons[0]}"
                )
        else:
            messages.success(request, f"Application {app.name} created.")
            return redirect("application-list", project.slug)
    apps = Application.objects.for_project(project)
    return render(
        request, "runs/applications.html", {"project": project, "applications": apps, "form": form}
    )


urlpatterns = [
    path("runs/", run_list, name="run-list"),
    path("runs/new", run_new, name="run-new"),
    path("runs/new/estimate", run_estimate, name="run-estimate"),
    path("runs/<int:run_id>/", run_detail, name="run-detail"),
    path("runs/<int:run_id>/progress", run_progress, name="run-progress"),
    path("runs/<int:run_id>/cancel", run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/retry", run_retry, name="run-retry"),
    path("runs/<int:run_id>/close", run_close, name="run-close"),
    path("runs/<int:run_id>/metrics/refresh", run_metrics_refresh, name="run-metrics-refresh"),
    path("runs/<int:run_id>/evaluators", run_add_evaluator, name="run-add-evaluator"),
    path("applications/", application_list, name="application-list"),
]
