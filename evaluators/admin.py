from django import forms
from django.contrib import admin

from evalsite.admin import pretty_json
from evaluators.models import (
    Evaluator,
    EvaluatorRevision,
    ModelConnection,
    Preset,
    ReliabilityRecord,
)
from evaluators.services import parameters_shown


class RevisionInline(admin.TabularInline):
    model = EvaluatorRevision
    fk_name = "evaluator"
    extra = 0
    can_delete = False
    fields = ["slug", "version", "message", "author", "created_at"]
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Evaluator)
class EvaluatorAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "kind", "project", "archived", "updated_at"]
    list_filter = ["kind", "archived", "project"]
    search_fields = ["name", "slug", "description"]
    readonly_fields = ["head", "created_by", "created_at", "updated_at"]
    inlines = [RevisionInline]


@admin.register(EvaluatorRevision)
class EvaluatorRevisionAdmin(admin.ModelAdmin):
    """Revisions are records: everything is read-only."""

    list_display = [
        "slug",
        "kind",
        "version",
        "project",
        "author",
        "created_at",
        "schema_inferred_at",
    ]
    list_filter = ["kind", "project"]
    search_fields = ["slug", "message"]
    fields = [
        "slug",
        "evaluator",
        "kind",
        "version",
        "message",
        "author",
        "created_at",
        "parameters_pretty",
        "schemas_pretty",
        "examples_pretty",
        "schema_inferred_at",
        "schema_inferred_by",
    ]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Parameters")
    def parameters_pretty(self, obj):
        return pretty_json(parameters_shown(obj.kind, obj.parameters))

    @admin.display(description="Schemas")
    def schemas_pretty(self, obj):
        return pretty_json(obj.schemas)

    @admin.display(description="Examples")
    def examples_pretty(self, obj):
        return pretty_json(obj.examples)


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "slug", "project"]
    list_filter = ["kind", ("project", admin.EmptyFieldListFilter)]
    search_fields = ["name", "slug", "description"]


class ModelConnectionAdminForm(forms.ModelForm):
    """The API key is write-only: a password field sets a new one; nothing shows the stored one."""

    new_api_key = forms.CharField(
        required=False,
        label="API key",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Stored encrypted and never shown. Leave empty to keep the stored key.",
    )
    clear_api_key = forms.BooleanField(required=False, label="Remove the stored key")

    class Meta:
        model = ModelConnection
        fields = [
            "project",
            "slug",
            "name",
            "base_url",
            "model_names",
            "prices",
            "rate_limit_rpm",
            "timeout_seconds",
            "failing_reason",
        ]

    def save(self, commit=True):
        connection = super().save(commit=False)
        if self.cleaned_data.get("new_api_key"):
            connection.set_api_key(self.cleaned_data["new_api_key"])
        elif self.cleaned_data.get("clear_api_key"):
            connection.set_api_key("")
        if commit:
            connection.save()
        return connection


@admin.register(ModelConnection)
class ModelConnectionAdmin(admin.ModelAdmin):
    form = ModelConnectionAdminForm
    list_display = ["name", "slug", "project", "base_url", "rate_limit_rpm", "has_key", "failing"]
    list_filter = ["project"]
    search_fields = ["name", "slug", "base_url"]
    readonly_fields = ["failing_since", "created_by", "created_at", "updated_at"]

    @admin.display(boolean=True, description="Key")
    def has_key(self, obj):
        return obj.has_api_key

    @admin.display(boolean=True, description="Failing")
    def failing(self, obj):
        return obj.is_failing


@admin.register(ReliabilityRecord)
class ReliabilityRecordAdmin(admin.ModelAdmin):
    """Computed from gold labels (runs.review.reliability): inspect, never edit by hand."""

    list_display = [
        "revision",
        "gold_evaluator",
        "output_field",
        "gold_field",
        "type",
        "items",
        "computed_at",
    ]
    list_filter = ["type", "project"]
    list_select_related = ["revision", "gold_evaluator"]
    search_fields = ["revision__slug", "gold_evaluator__slug", "output_field", "gold_field"]
    exclude = ["figures"]
    readonly_fields = ["figures_pretty"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="Figures")
    def figures_pretty(self, obj):
        return pretty_json(obj.figures)
