"""Annotation queue pages: the queues, a queue's page (progress, agreement, items, gold), its
settings, items from a run, one item, the keyboard-first review page, adjudication, and the
gold labels out (CSV/JSONL, or into a testset). The services in ``runs.review`` check who may
review or adjudicate; a refusal (InvalidInput 403) is a 403 page here."""

from __future__ import annotations

import csv
import json
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.http import Http404, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST
from markdown_it import MarkdownIt

from evalsite.errors import InvalidInput
from evalsite.jsonpaths import dig
from evalsite.views import project_view
from runs import review
from runs.exports import FORMATS, csv_cell, stream_response
from runs.forms import GoldTestsetForm, ItemsAddForm, QueueForm, ReviewForm
from runs.models import (
    Annotation,
    AnnotationQueue,
    ItemStatus,
    Origin,
    QueueItem,
    Review,
    ReviewStatus,
)
from runs.traces import OUTPUTS_PATH, trace_dict

ITEMS_PER_PAGE = 50
# Raw HTML in instructions is shown as text, and markdown-it refuses javascript: and data: links.
MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def _markdown(text: str) -> str:
    return mark_safe(MARKDOWN.render(text)) if text.strip() else ""  # noqa: S308 (escaped above)


def _refused(exc: InvalidInput) -> None:
    """A service's 403 (not a reviewer or adjudicator of the queue) is a 403 page."""
    if exc.status == 403:
        raise PermissionDenied(next(iter(exc.fields.values()))[0])


def _form_errors(form, exc: InvalidInput, aliases: dict[str, str] | None = None) -> None:
    for field, reasons in exc.fields.items():
        name = (aliases or {}).get(field, field.removeprefix("selection."))
        form.add_error(name if name in form.fields else None, reasons[0])


def _queue_or_404(project, queue_ref: str) -> AnnotationQueue:
    queue = (
        AnnotationQueue.objects.for_project(project)
        .filter(slug=queue_ref)
        .select_related("project", "evaluator", "revision")
        .first()
    )
    if queue is None:
        raise Http404("No such queue.")
    return queue


def _item_or_404(queue: AnnotationQueue, item_id: int) -> QueueItem:
    item = (
        QueueItem.objects.filter(queue=queue, pk=item_id)
        .select_related("queue__project", "queue__revision", "trace", "run", "scenario", "gold")
        .first()
    )
    if item is None:
        raise Http404("No such item in this queue.")
    return item


def _adjudicator(request, queue: AnnotationQueue) -> bool:
    return review.may_adjudicate(queue, request.user, request.role)


# --- the queues ---------------------------------------------------------------------------------


@project_view()
def queue_list(request, project):
    queues = AnnotationQueue.objects.for_project(project).select_related("evaluator")
    if request.GET.get("q"):
        queues = queues.filter(name__icontains=request.GET["q"])
    rows = [{"queue": queue, "progress": review.queue_progress(queue)} for queue in queues]
    context = {"project": project, "rows": rows, "q": request.GET.get("q", "")}
    template = "runs/review/list.html#queue-table" if request.htmx else "runs/review/list.html"
    return render(request, template, context)


@project_view()
def queue_new(request, project):
    form = QueueForm(
        project, request.POST or None, initial={"evaluator": request.GET.get("evaluator")}
    )
    if request.method == "POST" and form.is_valid():
        try:
            queue = review.queue_create(
                project=project,
                evaluator=form.cleaned_data["evaluator"],
                author=request.user,
                **form.settings(),
            )
        except InvalidInput as exc:
            _form_errors(form, exc, QueueForm.ALIASES)
        else:
            messages.success(request, f"Queue {queue.name} created. Add items to review.")
            return redirect("queue-detail", project.slug, queue.slug)
    status = 400 if form.errors else 200
    return render(
        request, "runs/review/form.html", {"project": project, "form": form}, status=status
    )


@project_view()
def queue_edit(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    form = QueueForm(
        project, request.POST or None, queue=queue, initial=QueueForm.initial_for(queue)
    )
    if request.method == "POST" and form.is_valid():
        try:
            review.queue_update(queue=queue, **form.settings())
        except InvalidInput as exc:
            _form_errors(form, exc, QueueForm.ALIASES)
        else:
            messages.success(request, f"Queue {queue.name} saved.")
            return redirect("queue-detail", project.slug, queue.slug)
    status = 400 if form.errors else 200
    context = {"project": project, "form": form, "queue": queue}
    return render(request, "runs/review/form.html", context, status=status)


# --- a queue's page -----------------------------------------------------------------------------


def _figure(report: dict, key: str) -> dict | None:
    figure = report.get(key)
    return None if figure is None else {"key": key, **figure}


def _agreement(queue: AnnotationQueue) -> list[dict]:
    """Per label field: its figures and the reviewer x reviewer table (from queue.agreement)."""
    stored = queue.agreement or {}
    reviewers = stored.get("reviewers") or []
    fields = []
    for field in review.label_fields(queue):
        report = (stored.get("fields") or {}).get(field["name"])
        if not report:
            continue
        pairs = {}
        for pair in report.get("pairs") or []:
            pairs[pair["a"], pair["b"]] = pairs[pair["b"], pair["a"]] = pair
        fields.append(
            {
                "name": field["name"],
                "level": report.get("level"),
                "items": report.get("items", 0),
                "reviews": report.get("reviews", 0),
                "figures": [
                    figure
                    for figure in (
                        _figure(report, "percent_agreement"),
                        _figure(report, "cohen_kappa"),
                        _figure(report, "krippendorff_alpha"),
                    )
                    if figure is not None
                ],
                "reviewers": reviewers,
                "table": [(a, [pairs.get((a, b)) for b in reviewers]) for a in reviewers],
            }
        )
    return fields


def _items_page(request, queue: AnnotationQueue):
    items = (
        queue.items.select_related("trace", "scenario", "adjudicated_by")
        .annotate(submitted=Count("reviews", filter=Q(reviews__status=ReviewStatus.SUBMITTED)))
        .order_by("position")
    )
    status = request.GET.get("status", "")
    if status in ItemStatus.values:
        items = items.filter(status=status)
    return Paginator(items, ITEMS_PER_PAGE).get_page(request.GET.get("page")), status


def _detail_context(request, project, queue: AnnotationQueue, **forms) -> dict[str, Any]:
    progress = review.queue_progress(queue)
    page, status = _items_page(request, queue)
    return {
        "project": project,
        "queue": queue,
        "progress": progress,
        "agreement": _agreement(queue),
        "instructions": _markdown(queue.instructions),
        "page": page,
        "items": page.object_list,
        "status": status,
        "statuses": ItemStatus.choices,
        "can_edit": request.role in ("editor", "owner"),
        "reviewer": review.may_review(queue, request.user),
        "adjudicator": _adjudicator(request, queue),
        "reviewers": list(queue.reviewers.values_list("username", flat=True)),
        "adjudicators": list(queue.adjudicators.values_list("username", flat=True)),
        "add_form": forms.get("add_form") or ItemsAddForm(project),
        "testset_form": forms.get("testset_form") or GoldTestsetForm(project),
    }


REGIONS = ("queue-status", "queue-items")


@project_view()
def queue_detail(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    context = _detail_context(request, project, queue)
    region = request.GET.get("region") or request.headers.get("HX-Target")
    if request.htmx and region in REGIONS:
        return render(request, f"runs/review/detail.html#{region}", context)
    return render(request, "runs/review/detail.html", context)


@project_view()
def queue_items_add(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    form = ItemsAddForm(project, request.POST or None, initial={"run": request.GET.get("run")})
    if request.method == "POST" and form.is_valid():
        try:
            added = review.items_add_from_run(
                queue=queue, run=form.cleaned_data["run"], selection=form.selection()
            )
        except InvalidInput as exc:
            _form_errors(form, exc)
        else:
            messages.success(request, f"Added {added} item{'' if added == 1 else 's'}.")
            return redirect("queue-detail", project.slug, queue.slug)
    status = 400 if form.errors else 200
    context = {"project": project, "queue": queue, "form": form}
    return render(request, "runs/review/items_add.html", context, status=status)


# --- one item -----------------------------------------------------------------------------------


def _trace_view(item: QueueItem) -> dict[str, Any]:
    """What a reviewer reads: the root span's inputs and outputs and the trace's summary."""
    trace = item.trace
    roots = list(trace_dict(trace)["spans"].values())
    root = roots[0] if roots else {}
    inputs = dig(root, "attributes.ag.data.inputs")
    return {
        "trace": trace,
        "inputs": inputs,
        "input_pairs": list(inputs.items()) if isinstance(inputs, dict) else None,
        "outputs": dig(root, OUTPUTS_PATH),
        "status_message": root.get("status_message"),
    }


def _auto_verdicts(item: QueueItem) -> list[Annotation]:
    return list(
        Annotation.objects.filter(trace=item.trace, origin=Origin.AUTO)
        .select_related("evaluator", "revision")
        .order_by("evaluator_slug", "pk")
    )


def _submitted(item: QueueItem) -> list[Review]:
    return list(
        item.reviews.filter(status=ReviewStatus.SUBMITTED)
        .select_related("reviewer")
        .order_by("submitted_at", "pk")
    )


def _sees_others(request, item: QueueItem) -> bool:
    """Blinding protects a review still to give: it hides nothing from people who are not
    reviewers of the queue, nor once the item has left the reviewers."""
    if item.status != ItemStatus.OPEN or not review.may_review(item.queue, request.user):
        return True
    return review.sees_others(item, request.user, adjudicator=_adjudicator(request, item.queue))


def _answers(queue: AnnotationQueue, reviews: list[Review]) -> list[dict]:
    """The reviews side by side: per field, each reviewer's value and whether they differ."""
    rows = []
    for field in review.form_fields(queue):
        values = [(r.outputs or {}).get(field["name"]) for r in reviews]
        given = [value for value in values if value is not None]
        rows.append(
            {
                "name": field["name"],
                "values": values,
                "differ": field["type"] != "string" and len({repr(v) for v in given}) > 1,
            }
        )
    return rows


@project_view()
def queue_item_detail(request, project, queue_ref, item_id):
    queue = _queue_or_404(project, queue_ref)
    item = _item_or_404(queue, item_id)
    sees = _sees_others(request, item)
    reviews = _submitted(item) if sees else []
    context = {
        "project": project,
        "queue": queue,
        "item": item,
        **_trace_view(item),
        "sees_others": sees,
        "reviews": reviews,
        "answers": _answers(queue, reviews),
        "review_count": item.reviews.filter(status=ReviewStatus.SUBMITTED).count(),
        "verdicts": _auto_verdicts(item) if sees else [],
        "adjudicator": _adjudicator(request, queue),
    }
    if request.htmx and request.GET.get("region") == "queue-item-reviews":
        return render(request, "runs/review/item.html#queue-item-reviews", context)
    return render(request, "runs/review/item.html", context)


# --- reviewing ----------------------------------------------------------------------------------


def _previous(queue: AnnotationQueue, user, item: QueueItem | None) -> int | None:
    """The reviewer's submitted item just before this one in the queue's order (the last one
    when there is no current item): `k` goes there to read or change the answer."""
    mine = Review.objects.filter(queue=queue, reviewer=user, status=ReviewStatus.SUBMITTED)
    if item is not None:
        mine = mine.filter(item__position__lt=item.position)
    return mine.order_by("-item__position").values_list("item_id", flat=True).first()


def _review_context(request, project, queue, item, form=None) -> dict[str, Any]:
    context: dict[str, Any] = {
        "project": project,
        "queue": queue,
        "item": item,
        "instructions": _markdown(queue.instructions),
        "progress": review.queue_progress(queue),
        "previous": _previous(queue, request.user, item),
    }
    if item is None:
        return context
    own = Review.objects.filter(item=item, reviewer=request.user).first()
    answered = own is not None and own.status == ReviewStatus.SUBMITTED
    sees = review.sees_others(item, request.user)
    others = [r for r in _submitted(item) if r.reviewer_id != request.user.pk] if sees else []
    context.update(
        {
            **_trace_view(item),
            "form": form
            or ReviewForm(
                review.form_fields(queue), initial_outputs=own.outputs if answered else None
            ),
            "answered": answered,
            "open": item.status == ItemStatus.OPEN,
            "sees_others": sees,
            "others": others,
            "answers": _answers(queue, others),
            "verdicts": _auto_verdicts(item) if sees else [],
        }
    )
    return context


def _review_response(request, project, queue, item, form=None, status=200):
    context = _review_context(request, project, queue, item, form)
    if request.htmx:
        response = render(request, "runs/review/review.html#review-item", context, status=status)
        if status == 200:  # the address bar follows the item shown
            response["HX-Push-Url"] = (
                reverse("queue-review-item", args=[project.slug, queue.slug, item.pk])
                if item is not None
                else reverse("queue-review", args=[project.slug, queue.slug])
            )
        return response
    return render(request, "runs/review/review.html", context, status=status)


def _review_next(request, project, queue: AnnotationQueue):
    """The reviewer's next item (reserved for them), or the page that says nothing is left."""
    try:
        item = review.item_next(queue=queue, reviewer=request.user)
    except InvalidInput as exc:
        _refused(exc)
        raise
    if item is not None and not request.htmx:
        return redirect("queue-review-item", project.slug, queue.slug, item.pk)
    return _review_response(request, project, queue, item)


def _after_review(request, project, queue: AnnotationQueue):
    """The next item: in place for htmx, else through the page that hands it out."""
    if request.htmx:
        return _review_next(request, project, queue)
    return redirect("queue-review", project.slug, queue.slug)


@project_view()
def queue_review(request, project, queue_ref):
    """GET or POST (the "Start reviewing" button): claim the next item."""
    return _review_next(request, project, _queue_or_404(project, queue_ref))


@project_view()
def queue_review_item(request, project, queue_ref, item_id):
    queue = _queue_or_404(project, queue_ref)
    item = _item_or_404(queue, item_id)
    if not review.may_review(queue, request.user):
        raise PermissionDenied(f"{request.user.get_username()} is not a reviewer of this queue.")
    if request.method != "POST":
        return _review_response(request, project, queue, item)
    form = ReviewForm(review.form_fields(queue), request.POST)
    try:
        if request.POST.get("action") == "skip":
            review.review_skip(item=item, reviewer=request.user)
            return _after_review(request, project, queue)
        if form.is_valid():
            review.review_submit(item=item, reviewer=request.user, outputs=form.outputs())
            return _after_review(request, project, queue)
    except InvalidInput as exc:
        _refused(exc)
        _form_errors(form, exc)
        return _review_response(request, project, queue, item, form, status=exc.status)
    return _review_response(request, project, queue, item, form, status=400)


# --- adjudicating -------------------------------------------------------------------------------


def _adjudicate_context(request, project, queue, item, form=None) -> dict[str, Any]:
    context: dict[str, Any] = {
        "project": project,
        "queue": queue,
        "item": item,
        "instructions": _markdown(queue.instructions),
        "waiting": queue.items.filter(status=ItemStatus.ADJUDICATION).count(),
    }
    if item is None:
        return context
    reviews = _submitted(item)
    fields = review.form_fields(queue)
    majority = {
        field["name"]: review.majority(
            field, [(r.outputs or {}).get(field["name"]) for r in reviews]
        )
        for field in fields
    }
    context.update(
        {
            **_trace_view(item),
            "reviews": reviews,
            "answers": _answers(queue, reviews),
            "verdicts": _auto_verdicts(item),
            "form": form
            or ReviewForm(fields, initial_outputs=item.gold.outputs if item.gold else majority),
        }
    )
    return context


def _adjudicate_response(request, project, queue, item, form=None, status=200):
    context = _adjudicate_context(request, project, queue, item, form)
    if request.htmx:
        response = render(
            request, "runs/review/adjudicate.html#adjudicate-item", context, status=status
        )
        if item is not None and status == 200:
            url = reverse("queue-adjudicate-item", args=[project.slug, queue.slug, item.pk])
            response["HX-Push-Url"] = url
        return response
    return render(request, "runs/review/adjudicate.html", context, status=status)


def _adjudicate_next(request, project, queue: AnnotationQueue):
    item = queue.items.filter(status=ItemStatus.ADJUDICATION).order_by("position").first()
    if item is not None and not request.htmx:
        return redirect("queue-adjudicate-item", project.slug, queue.slug, item.pk)
    if item is not None:
        item = _item_or_404(queue, item.pk)
    return _adjudicate_response(request, project, queue, item)


def _check_adjudicator(request, queue: AnnotationQueue) -> None:
    if not _adjudicator(request, queue):
        raise PermissionDenied(f"{request.user.get_username()} may not adjudicate this queue.")


@project_view()
def queue_adjudicate(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    _check_adjudicator(request, queue)
    return _adjudicate_next(request, project, queue)


@project_view()
def queue_adjudicate_item(request, project, queue_ref, item_id):
    queue = _queue_or_404(project, queue_ref)
    item = _item_or_404(queue, item_id)
    _check_adjudicator(request, queue)
    if request.method != "POST":
        return _adjudicate_response(request, project, queue, item)
    form = ReviewForm(review.form_fields(queue), request.POST)
    if form.is_valid():
        try:
            review.item_adjudicate(
                item=item, adjudicator=request.user, outputs=form.outputs(), role=request.role
            )
        except InvalidInput as exc:
            _refused(exc)
            _form_errors(form, exc)
            return _adjudicate_response(request, project, queue, item, form, status=exc.status)
        if not request.htmx:  # a swapped region has nowhere to show it
            messages.success(request, f"Item {item.position} settled: its gold label is saved.")
            return redirect("queue-adjudicate", project.slug, queue.slug)
        return _adjudicate_next(request, project, queue)
    return _adjudicate_response(request, project, queue, item, form, status=400)


# --- gold labels out ----------------------------------------------------------------------------


class _Line:
    def write(self, value: str) -> str:
        return value


def _gold_csv(queue: AnnotationQueue):
    columns = review.gold_columns(queue)
    writer = csv.writer(_Line())
    yield writer.writerow(columns)
    for row in review.gold_rows(queue):
        yield writer.writerow([csv_cell(row.get(column)) for column in columns])


def _gold_jsonl(queue: AnnotationQueue):
    for row in review.gold_rows(queue):
        yield json.dumps(row, ensure_ascii=False, default=str) + "\n"


@project_view()
def queue_gold_export(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    fmt = request.GET.get("format", "csv")
    if fmt not in FORMATS:
        return HttpResponseBadRequest("format is csv or jsonl")
    chunks = _gold_csv(queue) if fmt == "csv" else _gold_jsonl(queue)
    return stream_response(chunks, fmt=fmt, filename=f"{queue.slug}-gold")


@require_POST
@project_view()
def queue_gold_testset(request, project, queue_ref):
    queue = _queue_or_404(project, queue_ref)
    form = GoldTestsetForm(project, request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(f"{k}: {v[0]}" for k, v in form.errors.items()))
        return redirect("queue-detail", project.slug, queue.slug)
    testset = form.cleaned_data["testset"]
    try:
        version = review.gold_to_testset(
            queue=queue, testset=testset, prefix=form.cleaned_data["prefix"], author=request.user
        )
    except InvalidInput as exc:
        messages.error(request, next(iter(exc.fields.values()))[0])
        return redirect("queue-detail", project.slug, queue.slug)
    messages.success(
        request, f"Testset {testset.name} version {version.version} has the gold columns."
    )
    return redirect("testset-detail", project.slug, testset.slug)


urlpatterns = [
    path("queues/", queue_list, name="queue-list"),
    path("queues/new", queue_new, name="queue-new"),
    path("queues/<slug:queue_ref>/", queue_detail, name="queue-detail"),
    path("queues/<slug:queue_ref>/edit", queue_edit, name="queue-edit"),
    path("queues/<slug:queue_ref>/items/add", queue_items_add, name="queue-items-add"),
    path(
        "queues/<slug:queue_ref>/items/<int:item_id>", queue_item_detail, name="queue-item-detail"
    ),
    path("queues/<slug:queue_ref>/review", queue_review, name="queue-review"),
    path(
        "queues/<slug:queue_ref>/review/<int:item_id>",
        queue_review_item,
        name="queue-review-item",
    ),
    path("queues/<slug:queue_ref>/adjudicate", queue_adjudicate, name="queue-adjudicate"),
    path(
        "queues/<slug:queue_ref>/items/<int:item_id>/adjudicate",
        queue_adjudicate_item,
        name="queue-adjudicate-item",
    ),
    path("queues/<slug:queue_ref>/gold", queue_gold_export, name="queue-gold-export"),
    path("queues/<slug:queue_ref>/gold/testset", queue_gold_testset, name="queue-gold-testset"),
]
