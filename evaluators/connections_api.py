"""Model connections REST API, and rendering a judge's prompt without calling the model.

The API key is write-only: it is accepted on create and update and never returned
(``has_api_key`` says whether one is stored).
"""

from __future__ import annotations

from django.http import Http404
from django.urls import path
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from evalsite.api import BUSY_RESPONSES, ERROR_RESPONSES
from evaluators.judge.connections import (
    model_connection_create,
    model_connection_delete,
    model_connection_test,
    model_connection_update,
)
from evaluators.models import ModelConnection
from evaluators.normalize import EvaluationError
from evaluators.services import judge_render, kind_resolve, parameters_validate


class ModelConnectionSerializer(serializers.ModelSerializer):
    models = serializers.ListField(
        child=serializers.CharField(max_length=200),
        source="model_names",
        required=False,
        help_text="Model names; the first is the default.",
    )
    api_key = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=4000,
        help_text="Write-only: stored encrypted, never returned. Empty or absent keeps the key.",
    )
    clear_api_key = serializers.BooleanField(
        write_only=True, required=False, default=False, help_text="Remove the stored key."
    )
    has_api_key = serializers.BooleanField(read_only=True)
    prices = serializers.JSONField(
        required=False,
        help_text='USD per 1M tokens per model: {"gpt-4o-mini": {"prompt": 0.15, "completion": 0.6}}.',
    )
    slug = serializers.SlugField(max_length=100, required=False, allow_blank=True)
    # Checked by the service (scheme, host, public address); Django's URL validator would refuse
    # plain host names such as http://vllm:8000/v1.
    base_url = serializers.CharField(max_length=500)

    class Meta:
        model = ModelConnection
        fields = [
            "id",
            "slug",
            "name",
            "base_url",
            "api_key",
            "clear_api_key",
            "has_api_key",
            "models",
            "prices",
            "rate_limit_rpm",
            "timeout_seconds",
            "failing_reason",
            "failing_since",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["failing_reason", "failing_since", "created_at", "updated_at"]


class ConnectionTestSerializer(serializers.Serializer):
    model = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="Empty: the first model."
    )


TEST_RESULT = inline_serializer(
    "ModelConnectionTestResult",
    {
        "ok": serializers.BooleanField(),
        "model": serializers.CharField(),
        "latency_ms": serializers.FloatField(allow_null=True),
        "answer": serializers.CharField(required=False),
        "tokens": serializers.DictField(child=serializers.IntegerField(), required=False),
        "error": inline_serializer(
            "ModelConnectionTestError",
            {"code": serializers.CharField(), "message": serializers.CharField()},
            required=False,
        ),
    },
)

REF = OpenApiParameter("ref", str, OpenApiParameter.PATH, description="Connection id or slug.")


@extend_schema(tags=["model connections"], parameters=[REF])
class ModelConnectionViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """The project's model connections (OpenAI-compatible endpoints for LLM judges)."""

    serializer_class = ModelConnectionSerializer
    lookup_field = "ref"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return ModelConnection.objects.for_project(self.request.project).order_by("-id")

    def get_object(self):
        connection = self.get_queryset().by_ref(self.kwargs["ref"]).first()
        if connection is None:
            raise Http404
        return connection

    @extend_schema(parameters=[])
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(
        parameters=[],
        request=ModelConnectionSerializer,
        responses={201: ModelConnectionSerializer, **ERROR_RESPONSES},
    )
    def create(self, request):
        body = ModelConnectionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = dict(body.validated_data)
        data.pop("clear_api_key", None)
        connection = model_connection_create(project=request.project, author=request.user, **data)
        return Response(ModelConnectionSerializer(connection).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=ModelConnectionSerializer,
        responses={200: ModelConnectionSerializer, **ERROR_RESPONSES},
    )
    def update(self, request, ref=None, partial=False):
        connection = self.get_object()
        body = ModelConnectionSerializer(connection, data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        connection = model_connection_update(connection=connection, **body.validated_data)
        return Response(ModelConnectionSerializer(connection).data)

    @extend_schema(
        request=ModelConnectionSerializer,
        responses={200: ModelConnectionSerializer, **ERROR_RESPONSES},
    )
    def partial_update(self, request, ref=None):
        return self.update(request, ref, partial=True)

    @extend_schema(responses={204: None, **ERROR_RESPONSES})
    def destroy(self, request, ref=None):
        model_connection_delete(connection=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=ConnectionTestSerializer,
        responses={200: TEST_RESULT, **ERROR_RESPONSES},
        description="Send one tiny request. A failing endpoint is a 200 with `ok: false`; "
        "a refused key (401/403) also marks the connection failing.",
    )
    @action(detail=True, methods=["post"])
    def test(self, request, ref=None):
        body = ConnectionTestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        connection = self.get_object()
        return Response(model_connection_test(connection=connection, **body.validated_data))


class RenderSerializer(serializers.Serializer):
    parameters = serializers.JSONField(help_text="The llm_judge parameters to render with.")
    inputs = serializers.DictField(default=dict)
    outputs = serializers.JSONField(required=False, allow_null=True, default=None)
    trace = serializers.DictField(required=False, allow_null=True, default=None)


class JudgeRenderView(APIView):
    """Render an LLM judge's prompt for one case, without calling the model.

    Unresolved variables (every one of them) and script failures come back as `error` with a
    200: the request was fine, the template is not. Rendering runs a template (and a judge
    script, for ``prompt_source: "script"``), so it needs the editor role, as invoking does.
    """

    @extend_schema(
        request=RenderSerializer,
        responses={
            200: inline_serializer(
                "JudgeRendered",
                {
                    "messages": serializers.ListField(
                        child=serializers.DictField(), allow_null=True
                    ),
                    "error": serializers.DictField(allow_null=True),
                },
            ),
            **ERROR_RESPONSES,
            **BUSY_RESPONSES,
        },
        tags=["evaluators"],
    )
    def post(self, request):
        body = RenderSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        parameters = parameters_validate(kind_resolve("llm_judge"), data["parameters"])
        try:
            messages = judge_render(
                project=request.project,
                parameters=parameters,
                inputs=data["inputs"],
                outputs=data["outputs"],
                trace=data["trace"],
            )
        except EvaluationError as exc:
            return Response({"messages": None, "error": exc.as_dict()})
        return Response({"messages": messages, "error": None})


router = SimpleRouter(trailing_slash=False)
router.register("model-connections", ModelConnectionViewSet, basename="api-model-connection")

urlpatterns = [
    path("llm-judge/render", JudgeRenderView.as_view(), name="llm-judge-render"),
    *router.urls,
]
