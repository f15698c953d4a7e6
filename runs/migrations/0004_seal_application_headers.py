"""Seal the header values HTTP applications stored in plain text (docs/security.md)."""

from django.db import migrations

from evaluators.crypto import is_sealed, seal, unseal


def _headers_mapped(apps, change):
    applications = apps.get_model("runs", "Application").objects
    for app in applications.filter(kind="http").only("pk", "config").iterator():
        headers = (app.config or {}).get("headers") or {}
        mapped = {name: change(value) for name, value in headers.items()}
        if mapped != headers:
            applications.filter(pk=app.pk).update(config={**app.config, "headers": mapped})


def seal_headers(apps, schema_editor):
    _headers_mapped(apps, lambda value: value if is_sealed(value) else seal(value))


def unseal_headers(apps, schema_editor):
    _headers_mapped(apps, unseal)


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_work_units")]

    operations = [migrations.RunPython(seal_headers, unseal_headers)]
