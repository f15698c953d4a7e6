from django.contrib import admin

from evalsite.admin import pretty_json
from evaluators.models import Evaluator, EvaluatorRevision, Preset


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
        return pretty_json(obj.parameters)

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


from evaluators.judge import admin as _judge_admin  # noqa: E402, F401  (ModelConnection)
