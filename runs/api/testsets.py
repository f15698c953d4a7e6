"""Testsets REST API: testsets, their versions and rows, file upload and streaming export.

Rows are addressed by ``index`` (0-based) in a version; every change of rows makes a new version
and answers with the testset, whose ``head`` is that version.
"""

from __future__ import annotations

from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.utils.urls import remove_query_param, replace_query_param

from evalsite.api import ERROR_RESPONSES
from evalsite.parsers import JSONParser
from runs import testsets as services
from runs.models import Testset, TestsetVersion

# --- serializers ------------------------------------------------------------------------------


class TestsetVersionSerializer(serializers.ModelSerializer):
    slug = serializers.CharField(read_only=True, help_text="`<testset slug>-v<version>`")
    columns = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Column names, first-seen order."
    )
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = TestsetVersion
        fields = ["id", "version", "slug", "columns", "row_count", "message", "created_by"]
        fields += ["created_at"]


class TestsetSerializer(serializers.ModelSerializer):
    head = TestsetVersionSerializer(read_only=True, help_text="The latest version.")
    version = serializers.SerializerMethodField(help_text="The head's version number.")
    columns = serializers.SerializerMethodField(help_text="The head's columns.")
    row_count = serializers.SerializerMethodField(help_text="The head's number of rows.")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Testset
        fields = ["id", "slug", "name", "description", "version", "columns", "row_count", "head"]
        fields += ["created_by", "created_at", "updated_at"]

    def get_version(self, testset) -> int | None:
        return testset.head.version if testset.head else None

    def get_columns(self, testset) -> list[str]:
        return list(testset.head.columns) if testset.head else []

    def get_row_count(self, testset) -> int:
        return testset.head.row_count if testset.head else 0


ROWS_HELP = "JSON objects, any keys; nested values are kept as they are."
FORMAT_HELP = "csv, json (an array of objects) or jsonl; detected from the file when omitted."


class _Message(serializers.Serializer):
    message = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500, help_text="Version message."
    )


class _BaseVersion(_Message):
    base_version = serializers.IntegerField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Refuse (400) unless the head is still this version: no lost updates.",
    )


class TestsetCreateSerializer(_Message):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(
        max_length=100, required=False, allow_blank=True, default="", help_text="From the name."
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")
    rows = serializers.ListField(child=serializers.JSONField(), help_text=ROWS_HELP)


class TestsetUploadSerializer(_Message):
    file = serializers.FileField(help_text="CSV, JSON or JSONL; see docs/testsets.md for limits.")
    format = serializers.ChoiceField(
        choices=services.FORMATS,
        required=False,
        allow_blank=True,
        default="",
        help_text=FORMAT_HELP,
    )
    name = serializers.CharField(
        max_length=200, required=False, allow_blank=True, default="", help_text="The file's name."
    )
    slug = serializers.SlugField(max_length=100, required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")


class TestsetUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)


class RowsSerializer(_BaseVersion):
    rows = serializers.ListField(child=serializers.JSONField(), help_text=ROWS_HELP)


class RowsUploadSerializer(_BaseVersion):
    file = serializers.FileField(help_text="CSV, JSON or JSONL.")
    format = serializers.ChoiceField(
        choices=services.FORMATS,
        required=False,
        allow_blank=True,
        default="",
        help_text=FORMAT_HELP,
    )


class RowUpdateSerializer(_BaseVersion):
    data = serializers.JSONField(help_text="The row's new JSON object.")
    merge = serializers.BooleanField(
        required=False, default=False, help_text="Merge `data`'s keys over the row's instead."
    )


class RowSerializer(serializers.Serializer):
    index = serializers.IntegerField(help_text="Position in the version, from 0.")
    data = serializers.DictField(help_text="The row: a JSON object.")


class RowPageSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    columns = serializers.ListField(child=serializers.CharField())
    count = serializers.IntegerField(help_text="Rows in the version.")
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = RowSerializer(many=True)


# --- views ------------------------------------------------------------------------------------

REF = OpenApiParameter("ref", str, OpenApiParameter.PATH, description="Testset id or slug.")
INDEX = OpenApiParameter("index", int, OpenApiParameter.PATH, description="Row index, from 0.")
VERSION = OpenApiParameter("version", int, description="Version number; the head when omitted.")
LIMIT = OpenApiParameter("limit", int, description="Rows per page (default 100, at most 1000).")
OFFSET = OpenApiParameter("offset", int, description="Index of the first row (default 0).")
BASE_VERSION = OpenApiParameter(
    "base_version", int, description="Refuse (400) unless the head is still this version."
)
MESSAGE = OpenApiParameter("message", str, description="Version message.")
EXPORT_FORMAT = OpenApiParameter(
    "format", str, enum=list(services.FORMATS), description="csv (default), json or jsonl."
)
UPLOAD_OR_JSON = {"application/json": RowsSerializer, "multipart/form-data": RowsUploadSerializer}


class _ExportNegotiation(DefaultContentNegotiation):
    """``?format=csv`` names the export format, not one of DRF's renderers."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def _is_upload(request) -> bool:
    return request.content_type.startswith(("multipart/", "application/x-www-form-urlencoded"))


def _int_param(request, name: str, default: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise exceptions.ValidationError({name: ["A whole number is required."]})


@extend_schema(tags=["testsets"])
class TestsetViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Testsets of the project: tables of JSON rows, versioned (each change is a new version)."""

    serializer_class = TestsetSerializer
    lookup_field = "ref"
    lookup_value_regex = "[^/]+"
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_queryset(self):
        return services.testset_list(project=self.request.project)

    def get_object(self) -> Testset:
        testset = services.testset_get(project=self.request.project, ref=self.kwargs["ref"])
        if testset is None:
            raise Http404
        return testset

    def _version(self, request, testset: Testset) -> TestsetVersion:
        number = _int_param(request, "version")
        version = services.testset_version_get(testset=testset, version=number)
        if version is None:
            raise exceptions.NotFound(f"No version {number} of {testset.slug}.")
        return version

    def _changed(self, request, testset: Testset, code=status.HTTP_200_OK) -> Response:
        testset = services.testset_get(project=request.project, ref=testset.pk)
        return Response(TestsetSerializer(testset).data, status=code)

    @extend_schema(
        parameters=[OpenApiParameter("search", str, description="Substring of name or slug.")],
        responses={200: TestsetSerializer(many=True), **ERROR_RESPONSES},
    )
    def list(self, request, *args, **kwargs):
        testsets = services.testset_list(
            project=request.project, search=request.query_params.get("search", "")
        ).select_related("created_by", "head__created_by")
        page = self.paginate_queryset(testsets.order_by("-id"))
        return self.get_paginated_response(TestsetSerializer(page, many=True).data)

    @extend_schema(
        request={
            "application/json": TestsetCreateSerializer,
            "multipart/form-data": TestsetUploadSerializer,
        },
        responses={201: TestsetSerializer, **ERROR_RESPONSES},
        description=(
            "Create from JSON `rows`, or upload a `file` (multipart) in CSV, JSON or JSONL. "
            "Errors name the row and column: `error.fields.file`."
        ),
    )
    def create(self, request):
        if _is_upload(request):
            body = TestsetUploadSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            testset = services.testset_create_from_file(
                project=request.project, author=request.user, **body.validated_data
            )
        else:
            body = TestsetCreateSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            testset = services.testset_create(
                project=request.project, author=request.user, **body.validated_data
            )
        return self._changed(request, testset, status.HTTP_201_CREATED)

    @extend_schema(parameters=[REF], responses={200: TestsetSerializer, **ERROR_RESPONSES})
    def retrieve(self, request, ref=None):
        return Response(TestsetSerializer(self.get_object()).data)

    @extend_schema(
        parameters=[REF],
        request=TestsetUpdateSerializer,
        responses={200: TestsetSerializer, **ERROR_RESPONSES},
        description="Rename or describe; rows and versions are untouched.",
    )
    def partial_update(self, request, ref=None):
        body = TestsetUpdateSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        testset = services.testset_update(testset=self.get_object(), **body.validated_data)
        return self._changed(request, testset)

    @extend_schema(
        parameters=[REF],
        responses={204: None, **ERROR_RESPONSES},
        description="Delete with every version. 400 while a run uses any of its versions.",
    )
    def destroy(self, request, ref=None):
        services.testset_delete(testset=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        operation_id="testsets_versions_list",
        parameters=[REF],
        responses={200: TestsetVersionSerializer(many=True), **ERROR_RESPONSES},
    )
    @action(detail=True, methods=["get"])
    def versions(self, request, ref=None):
        versions = self.get_object().versions.select_related("testset", "created_by")
        page = self.paginate_queryset(versions)
        return self.get_paginated_response(TestsetVersionSerializer(page, many=True).data)

    @extend_schema(
        operation_id="testsets_rows_list",
        parameters=[REF, VERSION, LIMIT, OFFSET],
        responses={200: RowPageSerializer, **ERROR_RESPONSES},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def rows(self, request, ref=None):
        version = self._version(request, self.get_object())
        limit = min(max(_int_param(request, "limit", 100), 1), 1000)
        offset = max(_int_param(request, "offset", 0), 0)
        rows = services.testset_rows(version=version, offset=offset, limit=limit)
        url = request.build_absolute_uri()
        following = offset + limit
        return Response(
            {
                "version": version.version,
                "columns": version.columns,
                "count": version.row_count,
                "next": replace_query_param(url, "offset", following)
                if following < version.row_count
                else None,
                "previous": _previous(url, offset, limit),
                "results": [
                    {"index": row.index, "data": services.row_ordered(row.data, version.columns)}
                    for row in rows
                ],
            }
        )

    @extend_schema(
        operation_id="testsets_rows_add",
        parameters=[REF],
        request=UPLOAD_OR_JSON,
        responses={201: TestsetSerializer, **ERROR_RESPONSES},
        description="Append rows (JSON `rows`, or a multipart `file`): a new version.",
    )
    @rows.mapping.post
    def rows_add(self, request, ref=None):
        testset = self.get_object()
        rows, options = self._rows_body(request)
        services.testset_rows_add(testset=testset, rows=rows, author=request.user, **options)
        return self._changed(request, testset, status.HTTP_201_CREATED)

    @extend_schema(
        operation_id="testsets_rows_replace",
        parameters=[REF],
        request=UPLOAD_OR_JSON,
        responses={200: TestsetSerializer, **ERROR_RESPONSES},
        description="Replace every row (JSON `rows`, or a multipart `file`): a new version.",
    )
    @rows.mapping.put
    def rows_replace(self, request, ref=None):
        testset = self.get_object()
        rows, options = self._rows_body(request)
        services.testset_revise(testset=testset, rows=rows, author=request.user, **options)
        return self._changed(request, testset)

    def _rows_body(self, request) -> tuple[list, dict]:
        """``(rows, {message, base_version})`` from a JSON body or an uploaded file."""
        if _is_upload(request):
            body = RowsUploadSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            data = dict(body.validated_data)
            upload = data.pop("file")
            parsed = services.testset_file_read(file=upload, format=data.pop("format"))
            data["message"] = data["message"] or f"Uploaded {upload.name}"
            return parsed.rows, data
        body = RowsSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        return data.pop("rows"), data

    @extend_schema(
        operation_id="testsets_row_retrieve",
        parameters=[REF, INDEX, VERSION],
        responses={200: RowSerializer, **ERROR_RESPONSES},
    )
    @action(detail=True, methods=["get"], url_path=r"rows/(?P<index>\d+)")
    def row(self, request, ref=None, index=None):
        version = self._version(request, self.get_object())
        found = services.testset_rows(version=version, offset=int(index), limit=1)
        if not found:
            raise exceptions.NotFound(f"No row {index} in v{version.version}.")
        data = services.row_ordered(found[0].data, version.columns)
        return Response({"index": found[0].index, "data": data})

    @extend_schema(
        operation_id="testsets_row_update",
        parameters=[REF, INDEX],
        request=RowUpdateSerializer,
        responses={200: TestsetSerializer, **ERROR_RESPONSES},
        description="Replace (or with `merge`, update) one row of the head: a new version.",
    )
    @row.mapping.patch
    def row_update(self, request, ref=None, index=None):
        testset = self._head_row(request, index)
        body = RowUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        services.testset_row_update(
            testset=testset, index=int(index), author=request.user, **body.validated_data
        )
        return self._changed(request, testset)

    @extend_schema(
        operation_id="testsets_row_delete",
        parameters=[REF, INDEX, MESSAGE, BASE_VERSION],
        responses={200: TestsetSerializer, **ERROR_RESPONSES},
        description="Remove one row of the head (later rows move up): a new version.",
    )
    @row.mapping.delete
    def row_delete(self, request, ref=None, index=None):
        testset = self._head_row(request, index)
        services.testset_row_delete(
            testset=testset,
            index=int(index),
            message=request.query_params.get("message", ""),
            base_version=_int_param(request, "base_version"),
            author=request.user,
        )
        return self._changed(request, testset)

    def _head_row(self, request, index) -> Testset:
        testset = self.get_object()
        head = testset.head
        if head is None or int(index) >= head.row_count:
            raise exceptions.NotFound(f"No row {index} in the head of {testset.slug}.")
        return testset

    @extend_schema(
        operation_id="testsets_export",
        parameters=[REF, EXPORT_FORMAT, VERSION],
        responses={
            (200, "text/csv"): OpenApiTypes.STR,
            (200, "application/json"): {"type": "array", "items": {"type": "object"}},
            (200, "application/x-ndjson"): OpenApiTypes.STR,
            **ERROR_RESPONSES,
        },
        description="Stream a version as a file (a download; rows are never all in memory).",
    )
    @action(detail=True, methods=["get"], content_negotiation_class=_ExportNegotiation)
    def export(self, request, ref=None):
        testset = self.get_object()
        version = self._version(request, testset)
        fmt = request.query_params.get("format") or "csv"
        chunks = services.testset_export(version=version, format=fmt)
        response = StreamingHttpResponse(chunks, content_type=services.EXPORT_CONTENT_TYPES[fmt])
        filename = f"{testset.slug}-v{version.version}.{fmt}"
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response


def _previous(url: str, offset: int, limit: int) -> str | None:
    if offset <= 0:
        return None
    if offset - limit <= 0:
        return remove_query_param(url, "offset")
    return replace_query_param(url, "offset", offset - limit)


router = SimpleRouter(trailing_slash=False)
# "api-testset", not "testset": the pages own the testset-* url names.
router.register("testsets", TestsetViewSet, basename="api-testset")

urlpatterns = router.urls
