"""Admin for model connections (imported by evaluators/admin.py). The API key is write-only:
a password field sets a new one; nothing ever shows the stored one."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from evaluators.models import ModelConnection


class ModelConnectionAdminForm(forms.ModelForm):
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
