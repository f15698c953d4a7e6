from django import forms
from django.contrib import admin, messages
from django.db.models.functions import Length
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from evalsite.admin import pretty_json
from evalsite.errors import InvalidInput
from runs import engine
from runs.models import (
    Annotation,
    AnnotationQueue,
    Application,
    InferredSchema,
    JudgeAlignment,
    OnlineRule,
    QueueItem,
    Result,
    Review,
    Run,
    RunMetrics,
    RunStep,
    Scenario,
    ScenarioValue,
    ScenarioValuePack,
    Session,
    SessionRuleState,
    Span,
    Testcase,
    Testset,
    TestsetVersion,
    Trace,
    WorkUnit,
)
from runs.online import online_backfill, rule_target_check


class TestsetVersionInline(admin.TabularInline):
    model = TestsetVersion
    fields = ["version", "row_count", "message", "created_by", "created_at"]
    readonly_fields = fields
    ordering = ["-version"]
    extra, can_delete, show_change_link = 0, False, True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Testset)
class TestsetAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "project", "head", "updated_at"]
    list_filter = ["project"]
    list_select_related = ["project", "head"]
    search_fields = ["name", "slug", "description"]
    readonly_fields = ["head", "created_by", "created_at", "updated_at"]
    inlines = [TestsetVersionInline]

    def has_delete_permission(self, request, obj=None):
        # Delete through the page or API: runs.testsets.testset_delete refuses while runs use a
        # version and deletes rows in SQL (the admin collector would load every row).
        return False


@admin.register(TestsetVersion)
class TestsetVersionAdmin(admin.ModelAdmin):
    """Read-only: versions are immutable. Rows are edited through the pages or the API."""

    list_display = ["__str__", "project", "row_count", "message", "created_by", "created_at"]
    list_filter = ["project"]
    list_select_related = ["testset", "project", "created_by"]
    search_fields = ["testset__slug", "testset__name", "message"]
    readonly_fields = ["export"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Export")
    def export(self, obj):
        url = reverse("testset-export", args=[obj.project.slug, obj.testset.slug])
        links = [
            (f"{url}?format={f}&version={obj.version}", f.upper()) for f in ("csv", "json", "jsonl")
        ]
        return format_html_join(" · ", '<a href="{}">{}</a>', links)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records written by the engine and ingestion: inspect, never edit by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class SpanFormSet(forms.BaseInlineFormSet):
    """The trace's spans read on its day only (``trace_time`` is the trace's ``created_at``):
    the partition key prunes the read to one day's table instead of every one."""

    def __init__(self, *args, instance=None, queryset=None, **kwargs):
        if instance is not None and queryset is not None:
            queryset = queryset.filter(trace_time=instance.created_at)
        super().__init__(*args, instance=instance, queryset=queryset, **kwargs)


class SpanInline(admin.TabularInline):
    model = Span
    formset = SpanFormSet
    fields = ["span_id", "parent_id", "name", "kind", "status", "start_time", "end_time"]
    readonly_fields = fields
    extra, can_delete = 0, False


@admin.register(Trace)
class TraceAdmin(ReadOnlyAdmin):
    list_display = [
        "trace_id",
        "name",
        "project",
        "status",
        "duration_ms",
        "tokens",
        "cost",
        "span_count",
        "source",
        "start_time",
    ]
    list_filter = ["status", "source", "project"]
    search_fields = ["trace_id", "name"]
    inlines = [SpanInline]


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    """Sums of traces, recomputed at every ingest (runs.traces.sessions): read, never edit."""

    list_display = [
        "session_id",
        "project",
        "trace_count",
        "status",
        "duration_ms",
        "tokens",
        "cost",
        "start_time",
        "last_activity",
    ]
    list_filter = ["status", "project", "last_activity"]
    list_select_related = ["project"]
    search_fields = ["session_id"]
    readonly_fields = ["traces"]

    @admin.display(description="Traces")
    def traces(self, obj):
        url = reverse("admin:runs_trace_changelist")
        query = urlencode({"project__id__exact": obj.project_id, "session_id": obj.session_id})
        return format_html('<a href="{}?{}">{} traces</a>', url, query, obj.trace_count)


@admin.register(Span)
class SpanAdmin(ReadOnlyAdmin):
    list_display = ["name", "span_id", "trace", "kind", "status", "start_time"]
    list_filter = ["kind", "status"]
    search_fields = ["span_id", "name", "trace__trace_id"]
    exclude = ["attributes"]
    readonly_fields = ["attributes_pretty"]

    @admin.display(description="Attributes")
    def attributes_pretty(self, obj):
        return pretty_json(obj.attributes)


@admin.register(Application)
class ApplicationAdmin(admin.ModelAdmin):
    """The config is read-only here: its header values are sealed and never shown."""

    list_display = ["name", "slug", "kind", "project", "created_at"]
    list_filter = ["kind", "project"]
    search_fields = ["name", "slug"]
    exclude = ["config"]
    readonly_fields = ["config_pretty"]

    @admin.display(description="Config")
    def config_pretty(self, obj):
        return pretty_json(obj.config_shown)


class RunStepInline(admin.TabularInline):
    model = RunStep
    fields = ["key", "type", "position", "revision"]
    readonly_fields = fields
    extra, can_delete = 0, False

    def has_add_permission(self, request, obj=None):
        return False


class RunAdminForm(forms.ModelForm):
    class Meta:
        model = Run
        fields = [
            "project",
            "name",
            "description",
            "is_online",
            "query",
            "repeats",
            "closed",
            "tags",
            "created_by",
            "created_at",
        ]

    def clean_tags(self):
        try:
            return engine.tags_validate(self.cleaned_data["tags"])
        except InvalidInput as exc:
            raise forms.ValidationError(" ".join(r for rs in exc.fields.values() for r in rs))


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    form = RunAdminForm
    list_display = [
        "name",
        "project",
        "status",
        "tags_shown",
        "done_cells",
        "total_cells",
        "error_cells",
        "closed",
        "created_at",
    ]
    list_filter = ["status", "is_online", "closed", "project"]
    search_fields = ["name", "description"]
    readonly_fields = [
        "status",
        "max_cost_usd",
        "testset_version",
        "application",
        "total_cells",
        "done_cells",
        "error_cells",
        "scenario_count",
        "mappings_pretty",
        "error",
        "started_at",
        "finished_at",
        "progressed_at",
        "metrics_refreshed_at",
    ]
    exclude = ["mappings"]
    inlines = [RunStepInline]
    actions = ["cancel", "retry_failed", "refresh_metrics"]

    @admin.display(description="Tags")
    def tags_shown(self, obj):
        return ", ".join(f"{k}: {v}" for k, v in (obj.tags or {}).items())

    @admin.display(description="Mappings")
    def mappings_pretty(self, obj):
        return pretty_json(obj.mappings)

    @admin.action(description="Cancel selected runs")
    def cancel(self, request, queryset):
        for run in queryset:
            engine.run_cancel(run=run)

    @admin.action(description="Retry failed cells")
    def retry_failed(self, request, queryset):
        for run in queryset:
            try:
                engine.run_retry_failed(run=run)
            except InvalidInput as exc:
                self.message_user(request, f"{run}: {exc}", messages.WARNING)

    @admin.action(description="Refresh metrics")
    def refresh_metrics(self, request, queryset):
        for run in queryset:
            engine.run_metrics_refresh_request(run=run)


@admin.register(WorkUnit)
class WorkUnitAdmin(ReadOnlyAdmin):
    """Leased units of work: who holds what, until when, after how many attempts."""

    list_display = [
        "__str__",
        "lane",
        "status",
        "owner",
        "lease_expires_at",
        "attempts",
        "updated_at",
    ]
    list_filter = ["status", "lane"]
    search_fields = ["owner", "run__name"]
    exclude = ["error"]
    readonly_fields = ["error_pretty"]

    @admin.display(description="Error")
    def error_pretty(self, obj):
        return pretty_json(obj.error)


@admin.register(Scenario)
class ScenarioAdmin(ReadOnlyAdmin):
    list_display = ["run", "index", "status", "updated_at"]
    list_filter = ["status"]
    search_fields = ["run__name"]
    exclude = ["inputs"]
    readonly_fields = ["inputs_pretty"]

    @admin.display(description="Inputs")
    def inputs_pretty(self, obj):
        return pretty_json(obj.inputs)


@admin.register(Result)
class ResultAdmin(ReadOnlyAdmin):
    list_display = ["run", "scenario", "step_key", "repeat_idx", "status", "duration_ms"]
    list_filter = ["status"]
    search_fields = ["step_key", "run__name"]
    exclude = ["error"]
    readonly_fields = ["error_pretty"]

    @admin.display(description="Error")
    def error_pretty(self, obj):
        return pretty_json(obj.error)


@admin.register(Annotation)
class AnnotationAdmin(ReadOnlyAdmin):
    list_display = ["evaluator_slug", "revision", "trace", "origin", "channel", "created_at"]
    list_filter = ["origin", "channel", "project"]
    search_fields = ["evaluator_slug", "trace__trace_id"]
    exclude = ["outputs", "history", "details"]
    readonly_fields = ["outputs_pretty", "history_pretty", "details_pretty"]

    @admin.display(description="Outputs")
    def outputs_pretty(self, obj):
        return pretty_json(obj.outputs)

    @admin.display(description="History")
    def history_pretty(self, obj):
        return pretty_json(obj.history)

    @admin.display(description="Details")
    def details_pretty(self, obj):
        return pretty_json(obj.details)


@admin.register(RunMetrics)
class RunMetricsAdmin(ReadOnlyAdmin):
    list_display = ["run", "scenario", "bucket_start", "refreshed_at"]
    exclude = ["data"]
    readonly_fields = ["data_pretty"]

    @admin.display(description="Statistics")
    def data_pretty(self, obj):
        return pretty_json(obj.data)


@admin.register(ScenarioValue)
class ScenarioValueAdmin(ReadOnlyAdmin):
    """The read model, to look at: rewritten by every per-scenario refresh, never by hand."""

    list_display = ["run", "index", "step_key", "key", "value", "errors"]
    list_select_related = ["run"]
    raw_id_fields = ["run", "scenario"]
    show_full_result_count = False  # millions of rows: no count(*) per page


@admin.register(ScenarioValuePack)
class ScenarioValuePackAdmin(ReadOnlyAdmin):
    """The read model packed for comparisons, to see which runs have packs and of which
    refresh: rewritten after a finished run's refresh, never by hand. The bytes stay out of
    the page (megabytes at a million scenarios); their sizes are shown."""

    list_display = ["run", "step_key", "key", "count", "dtype", "scale", "size", "refreshed_at"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]
    exclude = ["indexes", "numbers", "errored"]
    readonly_fields = ["size"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .defer("indexes", "numbers", "errored")
            .annotate(packed=Length("indexes") + Length("numbers") + Length("errored"))
        )

    @admin.display(description="bytes")
    def size(self, obj) -> int:
        return obj.packed


class OnlineRuleAdminForm(forms.ModelForm):
    """The service's checks on the target: an idle time in bounds (a session rule idle for 0 s
    would judge each session at every turn), an evaluator that judges sessions."""

    class Meta:
        model = OnlineRule
        fields = ["revision", "idle_seconds"]  # the admin adds the rest of its fields

    def clean(self):
        data = super().clean()
        if "idle_seconds" not in data:  # not a number: the field says so already
            return data
        target = data.get("target", self.instance.target)  # read-only once the rule exists
        revision = data.get("revision", self.instance.revision if self.instance.pk else None)
        try:
            rule_target_check(revision, target, data.get("idle_seconds"))
        except InvalidInput as exc:
            for field, reasons in exc.fields.items():
                self.add_error(field if field in self.fields else None, reasons)
        return data


@admin.register(OnlineRule)
class OnlineRuleAdmin(admin.ModelAdmin):
    form = OnlineRuleAdminForm
    list_display = [
        "name",
        "project",
        "revision",
        "target",
        "sampling_rate",
        "active",
        "paused_reason",
    ]
    list_filter = ["active", "target", "project"]
    search_fields = ["name"]
    actions = ["backfill_last_24h"]

    def get_readonly_fields(self, request, obj=None):
        # A rule's live run holds trace or session scenarios: its target is fixed once made.
        return ["target", "sessions_swept_until"] if obj is not None else ["sessions_swept_until"]

    @admin.action(description="Re-run rule over the last 24 h")
    def backfill_last_24h(self, request, queryset):
        """A backfill of the last 24 hours: traces already evaluated are skipped."""
        from datetime import timedelta

        from django.utils import timezone

        until = timezone.now()
        for rule in queryset:
            try:
                progress = online_backfill(
                    rule=rule, since=until - timedelta(hours=24), until=until
                )
            except InvalidInput as exc:
                self.message_user(request, f"{rule}: {exc}", messages.ERROR)
            else:
                self.message_user(
                    request,
                    f"{rule}: {progress['queued']} of {progress['total']} matching traces queued.",
                )


@admin.register(SessionRuleState)
class SessionRuleStateAdmin(ReadOnlyAdmin):
    """What each session rule last judged of each session (the sweep claims these rows)."""

    list_display = ["rule", "session", "evaluated_activity", "evaluated_traces", "fired_at"]
    list_select_related = ["rule", "session"]
    search_fields = ["session__session_id", "rule__name"]
    raw_id_fields = ["session", "scenario"]


@admin.register(InferredSchema)
class InferredSchemaAdmin(ReadOnlyAdmin):
    """The cache of schemas inferred from stored outputs (the backfill page applies them)."""

    list_display = ["revision", "total", "inferred_at"]
    search_fields = ["revision__slug"]
    exclude = ["schema", "fields"]
    readonly_fields = ["schema_pretty"]

    @admin.display(description="Schema")
    def schema_pretty(self, obj):
        return pretty_json(obj.schema)


@admin.register(Testcase)
class TestcaseAdmin(ReadOnlyAdmin):
    """Rows of immutable testset versions: inspect here, edit through the testset pages."""

    list_display = ["version", "index"]
    list_select_related = ["version__testset"]
    search_fields = ["version__testset__slug"]
    exclude = ["data"]
    readonly_fields = ["data_pretty"]

    @admin.display(description="Row")
    def data_pretty(self, obj):
        return pretty_json(obj.data)


@admin.register(RunStep)
class RunStepAdmin(ReadOnlyAdmin):
    list_display = ["key", "run", "type", "position", "revision"]
    list_filter = ["type"]
    search_fields = ["key", "run__name"]
    exclude = ["references"]
    readonly_fields = ["references_pretty"]

    @admin.display(description="References")
    def references_pretty(self, obj):
        return pretty_json(obj.references)


@admin.register(AnnotationQueue)
class AnnotationQueueAdmin(admin.ModelAdmin):
    """Name, instructions and archiving may be changed here. Members and settings change
    through the pages or the API (runs.review.queue_update checks them); the form's revision
    is fixed, since reviews were answers to it."""

    list_display = [
        "name",
        "slug",
        "project",
        "evaluator",
        "reviewers_per_item",
        "blind",
        "archived",
        "updated_at",
    ]
    list_filter = ["archived", "blind", "project"]
    list_select_related = ["project", "evaluator"]
    search_fields = ["name", "slug"]
    fields = [
        "name",
        "instructions",
        "archived",
        "project",
        "slug",
        "evaluator",
        "revision",
        "reviewers_per_item",
        "blind",
        "min_agreement",
        "reservation_seconds",
        "reviewers",
        "adjudicators",
        "trace_filter",
        "sampling_rate",
        "items_link",
        "agreement_pretty",
        "agreement_refreshed_at",
        "created_by",
        "created_at",
        "updated_at",
    ]
    readonly_fields = fields[3:]

    def has_add_permission(self, request):
        return False  # queue_create checks the form and the members: use the pages or the API

    @admin.display(description="Items")
    def items_link(self, obj):
        url = reverse("admin:runs_queueitem_changelist") + f"?queue__id__exact={obj.pk}"
        return format_html('<a href="{}">{} items</a>', url, obj.items.count())

    @admin.display(description="Agreement")
    def agreement_pretty(self, obj):
        return pretty_json(obj.agreement)


@admin.register(QueueItem)
class QueueItemAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "queue", "status", "source", "agreement", "settled_by", "updated_at"]
    list_filter = ["status", "source", "settled_by", "queue"]
    list_select_related = ["queue"]
    search_fields = ["queue__slug", "trace__trace_id"]


@admin.register(Review)
class ReviewAdmin(ReadOnlyAdmin):
    list_display = ["item", "queue", "reviewer", "status", "reserved_until", "submitted_at"]
    list_filter = ["status"]
    list_select_related = ["queue", "reviewer", "item"]
    search_fields = ["queue__slug", "reviewer__username"]
    exclude = ["outputs"]
    readonly_fields = ["outputs_pretty"]

    @admin.display(description="Outputs")
    def outputs_pretty(self, obj):
        return pretty_json(obj.outputs)


@admin.register(JudgeAlignment)
class JudgeAlignmentAdmin(ReadOnlyAdmin):
    """Candidates are accepted or discarded on their page, where both records sit side by side."""

    list_display = ["__str__", "project", "queue", "status", "shots", "created_at", "decided_at"]
    list_filter = ["status", "project"]
    list_select_related = ["project", "queue", "base"]
    search_fields = ["queue__slug", "base__slug"]
    exclude = ["examples", "estimate", "records", "error"]
    readonly_fields = ["examples_pretty", "estimate_pretty", "records_pretty", "error_pretty"]

    @admin.display(description="Examples")
    def examples_pretty(self, obj):
        return pretty_json(obj.examples)

    @admin.display(description="Estimate")
    def estimate_pretty(self, obj):
        return pretty_json(obj.estimate)

    @admin.display(description="Records")
    def records_pretty(self, obj):
        return pretty_json(obj.records)

    @admin.display(description="Error")
    def error_pretty(self, obj):
        return pretty_json(obj.error)
