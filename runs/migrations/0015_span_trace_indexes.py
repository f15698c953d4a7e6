"""Indexes that ingestion wrote for nothing: a span's trace_id (span_unique_id starts with it),
a span's project_id (a project's spans now go with its traces) and a trace's project_id (every
other index of runs_trace starts with it). Only the indexes go: the trace's foreign key to its
project stays, and is not dropped and re-checked over the whole table as AlterField would."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evalsite", "0003_project_trace_retention"),
        ("runs", "0014_scenario_value_pack_shapes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                # On the partitioned parent: PostgreSQL drops every partition's index with it.
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "runs_span_project_id_098b4957"',
                    'CREATE INDEX IF NOT EXISTS "runs_span_project_id_098b4957" '
                    'ON "runs_span" ("project_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "runs_span_trace_id_e7942574"',
                    'CREATE INDEX IF NOT EXISTS "runs_span_trace_id_e7942574" '
                    'ON "runs_span" ("trace_id")',
                ),
                migrations.RunSQL(
                    'DROP INDEX IF EXISTS "runs_trace_project_id_c5456acd"',
                    'CREATE INDEX IF NOT EXISTS "runs_trace_project_id_c5456acd" '
                    'ON "runs_trace" ("project_id")',
                ),
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="span",
                    name="project",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="evalsite.project",
                    ),
                ),
                migrations.AlterField(
                    model_name="span",
                    name="trace",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="spans",
                        to="runs.trace",
                    ),
                ),
                migrations.AlterField(
                    model_name="trace",
                    name="project",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="traces",
                        to="evalsite.project",
                    ),
                ),
            ],
        )
    ]
