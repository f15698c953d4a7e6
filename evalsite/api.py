"""Tenancy endpoints (the current project, its API keys, health) and the scoping mixin every
app's viewsets use. Pagination and error bodies live in ``evalsite.rest``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from evalsite.health import check_all
from evalsite.models import MAX_RETENTION_DAYS, ApiKey, Project, Role
from evalsite.services import api_key_create, project_spend_cap_set, project_trace_retention_set


class ProjectScopedMixin:
    """Scope a viewset's queryset to ``request.project`` (set by ProjectRolePermission)."""

    def get_queryset(self):
        return super().get_queryset().filter(project=self.request.project)


ERROR_RESPONSES = {
    400: OpenApiResponse(description="Invalid input; `error.fields` names each field and why."),
    401: OpenApiResponse(description="Missing, malformed or revoked API key."),
    403: OpenApiResponse(description="Your role in the project does not allow this."),
    404: OpenApiResponse(description="Not found in your project."),
    413: OpenApiResponse(description="The body is larger than EVALSITE_MAX_BODY_BYTES."),
}
# Operations that execute the project's work while the request waits (evalsite.quotas).
BUSY_RESPONSES = {
    429: OpenApiResponse(
        description="The project already runs its EVALSITE_INTERACTIVE_SLOTS interactive "
        "evaluations; `Retry-After` says when to ask again."
    ),
}


class ProjectSerializer(serializers.ModelSerializer):
    role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "max_run_cost_usd",
            "trace_retention_days",
            "trace_retention_effective_days",
            "created_at",
            "role",
        ]

    max_run_cost_usd = serializers.DecimalField(
        max_digits=12,
        decimal_places=4,
        coerce_to_string=False,
        read_only=True,
        allow_null=True,
        help_text="Spend cap of one run (USD): runs projected over it are refused up front.",
    )
    trace_retention_days = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The project's own trace retention in whole days (plus today); null: the site's.",
    )
    trace_retention_effective_days = serializers.IntegerField(
        read_only=True,
        allow_null=True,
        help_text="The retention that applies: the project's, else the site's; null: forever.",
    )

    def get_role(self, project) -> str:
        return self.context["request"].role


class ProjectUpdateSerializer(serializers.Serializer):
    max_run_cost_usd = serializers.DecimalField(
        max_digits=12, decimal_places=4, min_value=0, allow_null=True, required=False
    )
    trace_retention_days = serializers.IntegerField(
        min_value=1,
        max_value=MAX_RETENTION_DAYS,
        allow_null=True,
        required=False,
        help_text="Keep traces this many whole days plus today; null: the site's setting. "
        "`GET /api/v1/project/retention` says what would go.",
    )


@extend_schema(
    methods=["GET"], responses={200: ProjectSerializer, **ERROR_RESPONSES}, tags=["projects"]
)
@extend_schema(
    methods=["PATCH"],
    request=ProjectUpdateSerializer,
    responses={200: ProjectSerializer, **ERROR_RESPONSES},
    tags=["projects"],
)
@api_view(["GET", "PATCH"])
def current_project(request):
    """The project this key (or session) acts in, with the caller's role. Owners PATCH its
    spend cap per run and its trace retention (each field only when sent)."""
    if request.method == "PATCH":
        body = ProjectUpdateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        changes = body.validated_data
        if "max_run_cost_usd" in changes:
            project_spend_cap_set(
                project=request.project, max_run_cost_usd=changes["max_run_cost_usd"]
            )
        if "trace_retention_days" in changes:
            project_trace_retention_set(
                project=request.project, trace_retention_days=changes["trace_retention_days"]
            )
    return Response(ProjectSerializer(request.project, context={"request": request}).data)


class ApiKeySerializer(serializers.ModelSerializer):
    role = serializers.ChoiceField(choices=Role.choices, default=Role.EDITOR)

    class Meta:
        model = ApiKey
        fields = ["id", "name", "role", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    key = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]


@extend_schema(tags=["projects"])
class ApiKeyViewSet(
    ProjectScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """API keys of the project. Owners only; the raw key is returned once, at creation."""

    queryset = ApiKey.objects.all()
    serializer_class = ApiKeySerializer

    @extend_schema(responses={201: ApiKeyCreatedSerializer, **ERROR_RESPONSES})
    def create(self, request):
        serializer = ApiKeySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key, raw = api_key_create(
            project=request.project, created_by=request.user, **serializer.validated_data
        )
        data = ApiKeySerializer(key).data | {"key": raw}
        return Response(data, status=status.HTTP_201_CREATED)

    @extend_schema(
        responses={204: None, **ERROR_RESPONSES},
        description="Revoke the key. It stays listed, with `revoked_at` set.",
    )
    def destroy(self, request, pk=None):
        self.get_object().revoke()
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(
    responses={
        200: inline_serializer(
            "Health", {"database": serializers.CharField(), "broker": serializers.CharField()}
        )
    },
    tags=["health"],
)
@api_view(["GET"])
@permission_classes([])
def healthz(request):
    """Database and broker reachability; 503 when either is down."""
    report = check_all()
    healthy = all(value == "ok" for value in report.values())
    return Response(report, status=200 if healthy else 503)
