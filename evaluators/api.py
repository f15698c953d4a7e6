"""Evaluators REST API: kinds, presets, evaluators and their revisions, and invoke."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response

from evalsite.api import BUSY_RESPONSES, ERROR_RESPONSES
from evalsite.errors import InvalidInput
from evaluators import selectors
from evaluators.kinds import REGISTRY
from evaluators.models import Evaluator, EvaluatorRevision, Preset
from evaluators.services import (
    evaluation_invoke,
    evaluator_create,
    evaluator_revise,
    kind_outputs_schema,
    kind_resolve,
    parameters_seal,
    parameters_shown,
    session_shape_problem,
)

# --- kinds and presets ------------------------------------------------------------------------


class PresetSerializer(serializers.ModelSerializer):
    builtin = serializers.SerializerMethodField()

    class Meta:
        model = Preset
        fields = ["kind", "slug", "name", "description", "parameters", "builtin"]

    def get_builtin(self, preset) -> bool:
        return preset.project_id is None


class KindSerializer(serializers.Serializer):
    key = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    settings_template = serializers.JSONField(
        help_text="JSON Schema of the parameters, with x-* UI hints."
    )
    outputs_schema = serializers.JSONField(
        allow_null=True, help_text="Outputs schema for the default parameters."
    )
    needs_ground_truth = serializers.BooleanField()
    needs_trace = serializers.BooleanField()
    needs_model = serializers.BooleanField()
    executes = serializers.BooleanField()
    presets = PresetSerializer(many=True)


def _kind_data(kind, project) -> dict:
    defaults = kind.defaults()
    outputs = (
        kind.outputs_schema(kind.parse(defaults))
        if defaults or not kind.parameters.model_fields
        else None
    )
    presets = Preset.objects.filter(kind=kind.key, project__isnull=True) | Preset.objects.filter(
        kind=kind.key, project=project
    )
    return {
        "key": kind.key,
        "name": kind.name,
        "description": kind.description,
        "settings_template": kind.settings_template(),
        "outputs_schema": outputs,
        "needs_ground_truth": kind.needs_ground_truth,
        "needs_trace": kind.needs_trace,
        "needs_model": kind.needs_model,
        "executes": kind.executes,
        "presets": PresetSerializer(presets.order_by("name"), many=True).data,
    }


@extend_schema(responses={200: KindSerializer(many=True), **ERROR_RESPONSES}, tags=["evaluators"])
@api_view(["GET"])
def kind_list(request):
    """Every evaluator kind with its settings template (JSON Schema) and presets."""
    kinds = sorted(REGISTRY.values(), key=lambda k: k.key)
    return Response([_kind_data(kind, request.project) for kind in kinds])


@extend_schema(responses={200: KindSerializer, **ERROR_RESPONSES}, tags=["evaluators"])
@api_view(["GET"])
def kind_detail(request, key: str):
    if key not in REGISTRY:
        raise Http404
    return Response(_kind_data(REGISTRY[key], request.project))


# --- evaluators and revisions -----------------------------------------------------------------


SEALED = (
    "Sealed settings (a webhook's `headers`, marked `x-sealed` in the settings template) are "
    'write-only: reads show each name with "••••••", never the value.'
)
SEALED_WRITE = (
    'In a sealed setting (a webhook\'s `headers`) a value "••••••" keeps the stored one, a new '
    "value replaces it, and a name left out is removed."
)

EXAMPLES_CHECK = (
    "Refuse the save (400 naming each case as `examples.<i>`, nothing stored) when an example "
    "case fails or is not run; by default the revision is saved with its `examples_report`."
)


class RevisionSerializer(serializers.ModelSerializer):
    evaluator = serializers.SerializerMethodField()
    parameters = serializers.SerializerMethodField(help_text=SEALED)
    author = serializers.SlugRelatedField(slug_field="username", read_only=True)
    schema_inferred_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    kind_outputs_schema = serializers.SerializerMethodField(
        help_text="The outputs schema the kind derives from these parameters (null when none): "
        "`schemas.outputs` differs from it when it was given (`outputs_schema`) or inferred."
    )

    class Meta:
        model = EvaluatorRevision
        fields = [
            "id",
            "slug",
            "version",
            "kind",
            "evaluator",
            "parameters",
            "schemas",
            "kind_outputs_schema",
            "examples",
            "examples_report",
            "message",
            "author",
            "created_at",
            "schema_inferred_at",
            "schema_inferred_by",
        ]

    def get_evaluator(self, revision) -> dict:
        return {"id": revision.evaluator_id, "slug": revision.evaluator.slug}

    def get_parameters(self, revision) -> dict[str, Any]:
        return parameters_shown(revision.kind, revision.parameters)

    def get_kind_outputs_schema(self, revision) -> dict[str, Any] | None:
        return kind_outputs_schema(revision.kind, revision.parameters)


class EvaluatorSerializer(serializers.ModelSerializer):
    head = RevisionSerializer(read_only=True)

    class Meta:
        model = Evaluator
        fields = [
            "id",
            "slug",
            "name",
            "description",
            "kind",
            "archived",
            "head",
            "created_at",
            "updated_at",
        ]


class EvaluatorCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.SlugField(max_length=100, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    kind = serializers.CharField(max_length=50)
    preset = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        help_text="Preset slug whose parameters fill in first.",
    )
    parameters = serializers.JSONField(
        required=False,
        default=dict,
        help_text="Missing settings get the kind's defaults. " + SEALED_WRITE,
    )
    outputs_schema = serializers.JSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Overrides the kind's outputs schema.",
    )
    examples = serializers.JSONField(required=False, default=list)
    examples_must_pass = serializers.BooleanField(
        required=False, default=False, help_text=EXAMPLES_CHECK
    )
    message = serializers.CharField(required=False, allow_blank=True, default="")


class EvaluatorUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    archived = serializers.BooleanField(required=False)
    parameters = serializers.JSONField(
        required=False,
        help_text="PUT replaces them; PATCH merges. A change (a sealed value too) makes a new "
        "revision. " + SEALED_WRITE,
    )
    outputs_schema = serializers.JSONField(required=False, allow_null=True, default=None)
    examples = serializers.JSONField(required=False, default=None)
    examples_must_pass = serializers.BooleanField(
        required=False, default=False, help_text=EXAMPLES_CHECK
    )
    message = serializers.CharField(required=False, allow_blank=True, default="")


REF = OpenApiParameter("ref", str, OpenApiParameter.PATH, description="Evaluator id or slug.")


@extend_schema(tags=["evaluators"], parameters=[REF])
class EvaluatorViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Evaluators of the project. Editing parameters creates a new immutable revision."""

    serializer_class = EvaluatorSerializer
    lookup_field = "ref"
    lookup_value_regex = "[^/]+"

    def get_queryset(self):
        return Evaluator.objects.for_project(self.request.project).select_related(
            "head__evaluator", "head__author", "head__schema_inferred_by"
        )

    def get_object(self):
        evaluator = self.get_queryset().by_ref(self.kwargs["ref"]).first()
        if evaluator is None:
            raise Http404
        return evaluator

    @extend_schema(
        parameters=[
            OpenApiParameter("kind", str, description="Only this kind."),
            OpenApiParameter("archived", bool, description="Archived ones instead of active ones."),
            OpenApiParameter("search", str, description="Substring of name, slug or description."),
        ]
    )
    def list(self, request, *args, **kwargs):
        evaluators = selectors.evaluator_list(
            project=request.project,
            search=request.query_params.get("search", ""),
            kind=request.query_params.get("kind", ""),
            archived=request.query_params.get("archived") in ("1", "true"),
        ).select_related("head__evaluator", "head__author")
        page = self.paginate_queryset(evaluators.order_by("-id"))
        return self.get_paginated_response(EvaluatorSerializer(page, many=True).data)

    @extend_schema(
        request=EvaluatorCreateSerializer,
        responses={201: EvaluatorSerializer, **ERROR_RESPONSES, **BUSY_RESPONSES},
        parameters=[],
    )
    def create(self, request):
        body = EvaluatorCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        evaluator = evaluator_create(
            project=request.project, author=request.user, **body.validated_data
        )
        return Response(EvaluatorSerializer(evaluator).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=EvaluatorUpdateSerializer,
        responses={200: EvaluatorSerializer, **ERROR_RESPONSES, **BUSY_RESPONSES},
    )
    def update(self, request, ref=None, partial=False):
        evaluator = self.get_object()
        body = EvaluatorUpdateSerializer(data=request.data, partial=partial)
        body.is_valid(raise_exception=True)
        evaluator_revise(
            evaluator=evaluator, author=request.user, partial=partial, **body.validated_data
        )
        return Response(EvaluatorSerializer(self.get_object()).data)

    @extend_schema(
        request=EvaluatorUpdateSerializer,
        responses={200: EvaluatorSerializer, **ERROR_RESPONSES, **BUSY_RESPONSES},
    )
    def partial_update(self, request, ref=None):
        return self.update(request, ref, partial=True)

    @extend_schema(
        responses={204: None, **ERROR_RESPONSES},
        description="Archive the evaluator (runs keep their revisions).",
    )
    def destroy(self, request, ref=None):
        evaluator_revise(evaluator=self.get_object(), archived=True, author=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={200: RevisionSerializer(many=True), **ERROR_RESPONSES})
    @action(detail=True, methods=["get"])
    def revisions(self, request, ref=None):
        revisions = self.get_object().revisions.select_related(
            "evaluator", "author", "schema_inferred_by"
        )
        page = self.paginate_queryset(revisions.order_by("-id"))
        return self.get_paginated_response(RevisionSerializer(page, many=True).data)


@extend_schema(
    responses={200: RevisionSerializer, **ERROR_RESPONSES},
    tags=["evaluators"],
    parameters=[
        OpenApiParameter(
            "ref", str, OpenApiParameter.PATH, description="Revision id or slug (toxicity-v3)."
        )
    ],
)
@api_view(["GET"])
def revision_detail(request, ref: str):
    revision = selectors.revision_get(project=request.project, ref=ref)
    if revision is None:
        raise Http404
    return Response(RevisionSerializer(revision).data)


# --- invoke -----------------------------------------------------------------------------------


class InvokeSerializer(serializers.Serializer):
    evaluator = serializers.CharField(
        required=False, help_text="Evaluator id or slug (its head revision)."
    )
    revision = serializers.CharField(
        required=False, help_text="Revision id or slug, or a version number with `evaluator`."
    )
    kind = serializers.CharField(
        required=False, help_text="Ad-hoc: a kind and its parameters instead of an evaluator."
    )
    parameters = serializers.JSONField(required=False, default=dict)
    inputs = serializers.DictField(
        default=dict,
        help_text="The testcase row (every column). With a session, empty means the first "
        "turn's root inputs.",
    )
    outputs = serializers.JSONField(
        required=False,
        help_text="The application's output: any JSON value. Required with a trace; with a "
        "session, missing means the last turn's root output.",
    )
    trace = serializers.DictField(required=False, allow_null=True, default=None)
    session = serializers.JSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text='A whole session to judge instead of a trace: {"session_id", "traces": '
        '[trace, ...] (oldest first), "messages": [...] (OpenAI-style)}. An evaluator that '
        "cannot judge sessions answers with the error `session_unsupported`.",
    )

    def validate_session(self, session):
        problem = None if session is None else session_shape_problem(session)
        if problem:
            raise serializers.ValidationError(problem)
        return session

    def validate(self, data):
        if not (data.get("evaluator") or data.get("revision") or data.get("kind")):
            raise serializers.ValidationError(
                {"evaluator": ["Give an evaluator, a revision, or a kind with parameters."]}
            )
        if data.get("session") is not None and data.get("trace") is not None:
            raise serializers.ValidationError({"session": ["Give a trace or a session, not both."]})
        if data.get("session") is None and "outputs" not in data:
            raise serializers.ValidationError({"outputs": ["This field is required."]})
        return data


class EvaluationSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["success", "error", "skipped"])
    outputs = serializers.JSONField(allow_null=True)
    error = inline_serializer(
        "EvaluationError",
        {
            "code": serializers.CharField(),
            "type": serializers.CharField(),
            "message": serializers.CharField(),
            "stacktrace": serializers.CharField(),
        },
        allow_null=True,
    )
    duration_ms = serializers.FloatField()
    logs = serializers.CharField()
    details = serializers.JSONField()


@extend_schema(
    request=InvokeSerializer,
    responses={200: EvaluationSerializer, **ERROR_RESPONSES, **BUSY_RESPONSES},
    tags=["evaluators"],
)
@api_view(["POST"])
def invoke(request):
    """Evaluate one output now and return the result; nothing is stored.

    Send `session` instead of `trace` to judge a whole conversation (code evaluators with
    `evaluate_session`, LLM judges, agent scores).
    A failing evaluation is a 200 with `status: "error"` (the evaluation ran and failed);
    a 400 means the request itself is wrong (unknown evaluator, invalid parameters, a malformed
    session).
    """
    body = InvokeSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    data = body.validated_data
    config = _invoke_config(request.project, data)
    result = evaluation_invoke(
        inputs=data["inputs"],
        outputs=data.get("outputs"),
        trace=data.get("trace"),
        session=data.get("session"),
        project=request.project,
        **config,
    )
    return Response(result.as_dict())


def _invoke_config(project, data) -> dict:
    if data.get("kind") and not (data.get("evaluator") or data.get("revision")):
        kind = kind_resolve(data["kind"])
        return {"kind": data["kind"], "parameters": parameters_seal(kind, data.get("parameters"))}
    if data.get("evaluator"):
        evaluator = selectors.evaluator_get(project=project, ref=data["evaluator"])
        if evaluator is None:
            raise InvalidInput(
                {"evaluator": [f"No evaluator {data['evaluator']!r} in this project."]}
            )
        revision = evaluator.head
        if data.get("revision"):
            revision = (
                evaluator.revisions.filter(version=data["revision"]).first()
                if data["revision"].isdecimal()
                else None
            )
            revision = revision or selectors.revision_get(project=project, ref=data["revision"])
            if revision is None or revision.evaluator_id != evaluator.pk:
                raise InvalidInput(
                    {"revision": [f"No revision {data['revision']!r} of {evaluator.slug}."]}
                )
        return {"revision": revision}
    revision = selectors.revision_get(project=project, ref=data["revision"])
    if revision is None:
        raise InvalidInput({"revision": [f"No revision {data['revision']!r} in this project."]})
    return {"revision": revision}
