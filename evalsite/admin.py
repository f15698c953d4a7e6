import json

from django.contrib import admin
from django.utils.html import format_html

from evalsite.models import ApiKey, Membership, Project


def pretty_json(value) -> str:
    """Read-only, pretty-printed JSON for admin pages of records."""
    return format_html(
        '<pre style="white-space: pre-wrap; max-height: 30em; overflow: auto">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "max_run_cost_usd", "trace_retention_days", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "project", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]
    autocomplete_fields = ["user", "project"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "role", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["role", "project", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "project__slug"]
    readonly_fields = ["prefix", "key_hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        # A key made here could never be shown to anyone; use the settings page or the command.
        return False

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        for key in queryset:
            key.revoke()
