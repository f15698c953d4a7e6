"""Seal the header values webhook evaluators stored in plain text (docs/security.md)."""

from django.db import migrations

from evaluators.crypto import is_sealed, seal, unseal


def _headers_mapped(apps, change):
    revisions = apps.get_model("evaluators", "EvaluatorRevision").objects
    for revision in revisions.filter(kind="webhook").only("pk", "parameters").iterator():
        headers = (revision.parameters or {}).get("headers") or {}
        mapped = {name: change(value) for name, value in headers.items()}
        if mapped != headers:
            # .update(): a revision's save() refuses edits; only the ciphertext changes.
            revisions.filter(pk=revision.pk).update(
                parameters={**revision.parameters, "headers": mapped}
            )


def seal_headers(apps, schema_editor):
    _headers_mapped(apps, lambda value: value if is_sealed(value) else seal(value))


def unseal_headers(apps, schema_editor):
    _headers_mapped(apps, unseal)


class Migration(migrations.Migration):
    dependencies = [("evaluators", "0003_model_connection")]

    operations = [migrations.RunPython(seal_headers, unseal_headers)]
