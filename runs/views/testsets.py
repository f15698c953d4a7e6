"""Testset pages: list, upload, detail (versions, paginated rows, inline row edits), export.

Row edits post to their own URLs and answer an HTMX request with the ``testset-rows`` region
(plus the versions card, out of band); a plain POST redirects back to the page. Errors come
back inline: with status 400 on a full page, 200 for HTMX (htmx 2 does not swap 4xx bodies).
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST
from django_htmx.http import push_url

from evalsite import jsonsafe
from evalsite.errors import InvalidInput
from evalsite.views import project_view
from runs import testsets as services

PAGE_SIZE = 50
FOLD_AT = 120  # characters; longer cells (or any with a newline) fold into <details>


class TestsetUploadForm(forms.Form):
    file = forms.FileField(
        required=False,
        help_text="CSV (first line: column names), JSON (an array of objects) or JSONL "
        "(one object per line). UTF-8, up to 50 MB and 100,000 rows.",
    )
    text = forms.CharField(
        required=False,
        label="…or paste the rows",
        widget=forms.Textarea(attrs={"rows": 6, "class": "mono"}),
        help_text="Same formats as a file.",
    )
    name = forms.CharField(max_length=200, required=False, help_text="Defaults to the file name.")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    format = forms.ChoiceField(
        required=False,
        choices=[("", "Detect"), ("csv", "CSV"), ("json", "JSON array"), ("jsonl", "JSONL")],
        help_text="Detected from the extension, then the content, unless chosen here.",
    )

    def clean(self):
        data = super().clean()
        if not data.get("file") and not data.get("text", "").strip():
            self.add_error("file", "Choose a file, or paste rows below.")
        elif not data.get("file") and not data.get("name", "").strip():
            self.add_error("name", "Name the pasted testset.")
        return data


class TestsetMetaForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))


def _errors_onto(form: forms.Form, exc: InvalidInput, rename: dict[str, str] | None = None):
    for field, reasons in exc.fields.items():
        field = (rename or {}).get(field, field)
        for reason in reasons:
            form.add_error(field if field in form.fields else None, reason)


def _testset_or_404(project, ref):
    testset = services.testset_get(project=project, ref=ref)
    if testset is None:
        raise Http404("No such testset.")
    return testset


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# --- list and upload --------------------------------------------------------------------------


@project_view()
def testset_list(request, project):
    search = request.GET.get("q", "").strip()
    context = {
        "project": project,
        "testsets": services.testset_list(project=project, search=search).order_by("name"),
        "q": search,
    }
    template = (
        "runs/testsets/list.html#testset-table" if request.htmx else "runs/testsets/list.html"
    )
    return render(request, template, context)


@project_view()
def testset_new(request, project):
    form = TestsetUploadForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        upload = data["file"]
        try:
            if upload:
                testset = services.testset_create_from_file(
                    project=project,
                    file=upload,
                    name=data["name"],
                    description=data["description"],
                    format=data["format"],
                    author=request.user,
                )
            else:
                parsed = services.testset_file_parse(
                    data=data["text"].encode(), format=data["format"]
                )
                testset = services.testset_create(
                    project=project,
                    name=data["name"],
                    description=data["description"],
                    rows=parsed.rows,
                    message="Created from pasted rows",
                    author=request.user,
                )
        except InvalidInput as exc:
            _errors_onto(form, exc, {"file": "file" if upload else "text", "slug": "name"})
        else:
            messages.success(request, f"Testset {testset.name} created with {_rows(testset)}.")
            return redirect("testset-detail", project.slug, testset.slug)
    status = 400 if request.method == "POST" else 200
    return render(
        request, "runs/testsets/new.html", {"project": project, "form": form}, status=status
    )


def _rows(testset) -> str:
    count = testset.head.row_count if testset.head else 0
    return f"{count:,} row{'' if count == 1 else 's'}"


# --- detail -----------------------------------------------------------------------------------


@project_view()
def testset_detail(request, project, ref):
    testset = _testset_or_404(project, ref)
    context = _detail_context(
        request,
        project,
        testset,
        version=_int(request.GET.get("version")),
        page=_int(request.GET.get("page"), 1),
        edit=_int(request.GET.get("edit")),
    )
    if request.htmx:
        return render(request, "runs/testsets/detail.html#testset-rows", context)
    return render(request, "runs/testsets/detail.html", context)


def _detail_context(request, project, testset, *, version=None, page=1, edit=None, **extra):
    head = testset.head
    shown = services.testset_version_get(testset=testset, version=version)
    if shown is None:
        raise Http404("No such version.")
    is_head = head is not None and shown.pk == head.pk
    can_edit = request.role in ("editor", "owner")
    pages = max(1, -(-shown.row_count // PAGE_SIZE))
    page = min(max(page, 1), pages)
    rows = services.testset_rows(version=shown, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    editable = can_edit and is_head
    edit = edit if editable else None
    context = {
        "project": project,
        "testset": testset,
        "head": head,
        "version": shown,
        "is_head": is_head,
        "can_edit": can_edit,
        "editable": editable,
        "columns": shown.columns,
        "colspan": len(shown.columns) + 2,
        "rows": [
            _row_view(row, shown.columns, project, testset, page if editable else None)
            for row in rows
        ],
        "page_url": _detail_url(project, testset, shown if not is_head else None, page),
        "page": page,
        "pages": pages,
        "page_links": _page_links(project, testset, shown if not is_head else None, page, pages),
        "edit": edit,
        "versions": testset.versions.select_related("created_by"),
        "meta_form": TestsetMetaForm(
            initial={"name": testset.name, "description": testset.description}
        ),
        "add_template": json.dumps({c: "" for c in shown.columns}, indent=2, ensure_ascii=False),
        "export_formats": services.FORMATS,
    }
    if edit is not None and "row_text" not in extra:
        editing = next((row for row in rows if row.index == edit), None)
        extra["row_text"] = _pretty(editing.data, shown.columns) if editing else ""
    return context | extra


def _detail_url(project, testset, version=None, page=1, **params) -> str:
    query = {"version": version.version if version else None, "page": page if page > 1 else None}
    query |= params
    encoded = urlencode({k: v for k, v in query.items() if v is not None})
    url = reverse("testset-detail", args=[project.slug, testset.slug])
    return f"{url}?{encoded}" if encoded else url


def _page_links(project, testset, version, page, pages) -> dict:
    def url(number):
        return _detail_url(project, testset, version, number)

    numbers, last = [], 0
    for n in range(1, pages + 1):
        if n in (1, pages) or abs(n - page) <= 2:
            if n > last + 1:
                numbers.append((None, None))  # a gap, shown as …
            numbers.append((n, url(n)))
            last = n
    return {
        "previous": url(page - 1) if page > 1 else None,
        "next": url(page + 1) if page < pages else None,
        "numbers": numbers,
    }


def _pretty(data: dict, columns: list[str]) -> str:
    return json.dumps(services.row_ordered(data, columns), indent=2, ensure_ascii=False)


def _row_view(row, columns, project, testset, page) -> dict:
    edit_url = _detail_url(project, testset, None, page, edit=row.index) if page else None
    cells = [_cell(row.data, column) for column in columns]
    return {"index": row.index, "cells": cells, "edit_url": edit_url}


def _cell(data: dict, column: str) -> dict:
    if column not in data:
        return {"missing": True}
    value = data[column]
    is_text = isinstance(value, str)
    text = value if is_text else json.dumps(value, ensure_ascii=False)
    folded = len(text) > FOLD_AT or "\n" in text
    full = value if is_text else json.dumps(value, indent=2, ensure_ascii=False)
    return {"text": text, "full": full, "folded": folded, "is_text": is_text}


# --- edits ------------------------------------------------------------------------------------


def _after_edit(request, project, testset, *, page, notice):
    """A saved edit: the refreshed region for HTMX, else back to the page with a message."""
    testset.refresh_from_db()
    if request.htmx:
        context = _detail_context(request, project, testset, page=page, notice=notice)
        response = render(request, "runs/testsets/detail.html#testset-rows", context)
        response.content += render(
            request, "runs/testsets/detail.html#testset-versions", context | {"oob": True}
        ).content
        return push_url(response, _detail_url(project, testset, None, context["page"]))
    messages.success(request, notice)
    return redirect(_detail_url(project, testset, None, page))


def _edit_failed(request, project, testset, exc: InvalidInput, *, page, slot, **extra):
    """Re-render with the posted text and the reasons in ``slot`` (the form they belong to)."""
    reasons = [reason for values in exc.fields.values() for reason in values]
    testset.refresh_from_db()
    context = _detail_context(request, project, testset, page=page, **extra, **{slot: reasons})
    if request.htmx:
        return render(request, "runs/testsets/detail.html#testset-rows", context)
    return render(request, "runs/testsets/detail.html", context, status=400)


def _saved(version, head_before) -> str:
    if version.pk == head_before:
        return "Nothing changed; no new version."
    return f"Saved as v{version.version}."


def _parse_row(text: str) -> dict:
    try:
        data = jsonsafe.loads(text)
    except jsonsafe.UnsafeJSON as exc:
        raise InvalidInput({"data": [f"Not valid JSON: {exc}."]})
    if not isinstance(data, dict):
        raise InvalidInput({"data": ['A row is a JSON object: {"column": value, ...}.']})
    return data


@require_POST
@project_view()
def testset_row_edit(request, project, ref, index):
    testset = _testset_or_404(project, ref)
    page = _int(request.POST.get("page"), 1)
    text = request.POST.get("data", "")
    head_before = testset.head_id
    try:
        version = services.testset_row_update(
            testset=testset,
            index=index,
            data=_parse_row(text),
            message=request.POST.get("message", "").strip(),
            base_version=_int(request.POST.get("base_version")),
            author=request.user,
        )
    except InvalidInput as exc:
        return _edit_failed(
            request, project, testset, exc, page=page, edit=index, row_text=text, slot="row_errors"
        )
    notice = _saved(version, head_before)
    return _after_edit(request, project, testset, page=page, notice=notice)


@require_POST
@project_view()
def testset_row_add(request, project, ref):
    testset = _testset_or_404(project, ref)
    text = request.POST.get("data", "")
    try:
        version = services.testset_rows_add(
            testset=testset,
            rows=[_parse_row(text)],
            message=request.POST.get("message", "").strip(),
            base_version=_int(request.POST.get("base_version")),
            author=request.user,
        )
    except InvalidInput as exc:
        page = _int(request.POST.get("page"), 1)
        return _edit_failed(
            request, project, testset, exc, page=page, add_text=text, slot="add_errors"
        )
    last_page = max(1, -(-version.row_count // PAGE_SIZE))
    notice = f"Row {version.row_count - 1} added; saved as v{version.version}."
    return _after_edit(request, project, testset, page=last_page, notice=notice)


@require_POST
@project_view()
def testset_row_delete(request, project, ref, index):
    testset = _testset_or_404(project, ref)
    page = _int(request.POST.get("page"), 1)
    try:
        version = services.testset_row_delete(
            testset=testset,
            index=index,
            base_version=_int(request.POST.get("base_version")),
            author=request.user,
        )
    except InvalidInput as exc:
        return _edit_failed(request, project, testset, exc, page=page, slot="errors")
    notice = f"Row {index} deleted; saved as v{version.version}."
    return _after_edit(request, project, testset, page=page, notice=notice)


@require_POST
@project_view()
def testset_update(request, project, ref):
    testset = _testset_or_404(project, ref)
    form = TestsetMetaForm(request.POST)
    if form.is_valid():
        try:
            services.testset_update(testset=testset, **form.cleaned_data)
        except InvalidInput as exc:
            _errors_onto(form, exc)
        else:
            messages.success(request, "Saved.")
            return redirect("testset-detail", project.slug, testset.slug)
    context = _detail_context(request, project, testset, meta_form=form, meta_open=True)
    return render(request, "runs/testsets/detail.html", context, status=400)


@project_view()
def testset_delete(request, project, ref):
    """GET asks to confirm (works without JavaScript); POST deletes."""
    testset = _testset_or_404(project, ref)
    errors = []
    if request.method == "POST":
        try:
            services.testset_delete(testset=testset)
        except InvalidInput as exc:
            errors = [reason for values in exc.fields.values() for reason in values]
        else:
            messages.success(request, f"Testset {testset.name} deleted.")
            return redirect("testset-list", project.slug)
    context = {"project": project, "testset": testset, "errors": errors}
    return render(request, "runs/testsets/delete.html", context, status=400 if errors else 200)


@project_view()
def testset_export(request, project, ref):
    testset = _testset_or_404(project, ref)
    version = services.testset_version_get(
        testset=testset, version=_int(request.GET.get("version"))
    )
    if version is None:
        raise Http404("No such version.")
    fmt = request.GET.get("format") or "csv"
    if fmt not in services.FORMATS:
        return HttpResponseBadRequest("Unknown format; use csv, json or jsonl.")
    chunks = services.testset_export(version=version, format=fmt)
    response = StreamingHttpResponse(chunks, content_type=services.EXPORT_CONTENT_TYPES[fmt])
    filename = f"{testset.slug}-v{version.version}.{fmt}"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


urlpatterns = [
    path("testsets/", testset_list, name="testset-list"),
    path("testsets/new", testset_new, name="testset-new"),
    path("testsets/<str:ref>/", testset_detail, name="testset-detail"),
    path("testsets/<str:ref>/update", testset_update, name="testset-update"),
    path("testsets/<str:ref>/delete", testset_delete, name="testset-delete"),
    path("testsets/<str:ref>/export", testset_export, name="testset-export"),
    path("testsets/<str:ref>/rows/add", testset_row_add, name="testset-row-add"),
    path("testsets/<str:ref>/rows/<int:index>/edit", testset_row_edit, name="testset-row-edit"),
    path(
        "testsets/<str:ref>/rows/<int:index>/delete", testset_row_delete, name="testset-row-delete"
    ),
]
