"""Spans keep ``trace_id`` but lose the database foreign key to ``runs_trace``
(docs/traces.md, "Partitions and retention").

With daily partitions the constraint cost on both ends: every deleted trace made PostgreSQL look
for referencing spans in every partition (it cannot know the day), and every inserted span paid
a lookup. Nothing is orphaned without it: retention deletes a trace's spans before the trace,
and any other trace deletion goes through Django's collector, which still cascades to spans.

Dropping the constraint on the partitioned parent drops its copies on every partition; going
back adds it to the parent, which adds it to every partition (and 0008's backward copy then
recreates it on the plain table). The index on ``trace_id`` stays.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0009_session_rules")]

    operations = [
        migrations.AlterField(
            model_name="span",
            name="trace",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="spans",
                to="runs.trace",
            ),
        ),
    ]
