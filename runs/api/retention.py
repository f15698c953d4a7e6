"""REST API of the retention dry run: what the next hourly run would delete in the project."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response

from evalsite.api import ERROR_RESPONSES
from runs.traces import retention_plan

RetentionReport = inline_serializer(
    "RetentionDryRun",
    {
        "now": serializers.DateTimeField(),
        "retention_days": serializers.IntegerField(
            allow_null=True, help_text="Whole days kept, plus today; null: forever."
        ),
        "cutoff": serializers.DateTimeField(
            allow_null=True, help_text="Production traces that arrived before this would go."
        ),
        "traces": serializers.IntegerField(
            help_text="Production traces (source api or otlp) that would be deleted."
        ),
        "spans": serializers.IntegerField(help_text="Their spans."),
        "oldest_kept": serializers.DateTimeField(
            allow_null=True, help_text="When the oldest production trace that stays arrived."
        ),
        "run_traces": serializers.IntegerField(
            help_text="Traces older than the cutoff that runs recorded (invocation, judge): "
            "kept, retention never deletes them."
        ),
        "partitions": inline_serializer(
            "RetentionPartition",
            {
                "name": serializers.CharField(),
                "start": serializers.DateTimeField(),
                "end": serializers.DateTimeField(),
            },
            many=True,
            help_text="Day partitions holding some of these traces' spans that would be "
            "dropped whole (nobody keeps a production trace in them, no run's trace is there).",
        ),
    },
)


@extend_schema(tags=["projects"], responses={200: RetentionReport, **ERROR_RESPONSES})
@api_view(["GET"])
def project_retention(request):
    """Dry run of trace retention for this project (owners): nothing is changed."""
    report = retention_plan(project=request.project)
    row = report.projects[0].as_dict()
    del row["project"]
    return Response(
        {
            "now": report.as_dict()["now"],
            **row,
            "partitions": [p.as_dict() for p in report.partitions],
        }
    )


urlpatterns = [path("project/retention", project_retention, name="api-project-retention")]
