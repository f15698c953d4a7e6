# Online rules that target sessions (docs/online.md#session-rules): the rule's target and idle
# time, a scenario's session, and the state row that makes a session fire once per idle period.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("evalsite", "0002_run_tags_cost_cap"),
        ("runs", "0008_spans_partitioned"),
    ]

    operations = [
        migrations.AddField(
            model_name="onlinerule",
            name="target",
            field=models.CharField(
                choices=[("trace", "Traces"), ("session", "Sessions")],
                default="trace",
                help_text="What one evaluation judges: a trace, or a whole session. Fixed for life.",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="onlinerule",
            name="idle_seconds",
            field=models.PositiveIntegerField(
                default=900,
                help_text="Session rules: judge a session once nothing arrived this long.",
            ),
        ),
        migrations.AddField(
            model_name="onlinerule",
            name="sessions_swept_until",
            field=models.DateTimeField(
                blank=True,
                help_text="Session rules: sessions whose spans all arrived by then have been decided.",
                null=True,
            ),
        ),
        migrations.AddIndex(
            model_name="session",
            index=models.Index(fields=["project", "updated_at"], name="session_arrival"),
        ),
        migrations.AddField(
            model_name="scenario",
            name="session",
            field=models.ForeignKey(
                blank=True,
                help_text="Session rules: the session this scenario evaluates, as of its trace.",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="runs.session",
            ),
        ),
        migrations.AlterField(
            model_name="scenario",
            name="trace",
            field=models.ForeignKey(
                blank=True,
                help_text="Online runs: the trace this scenario evaluates (a session's last trace).",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="runs.trace",
            ),
        ),
        migrations.RemoveConstraint(model_name="scenario", name="scenario_unique_trace"),
        migrations.AddConstraint(
            model_name="scenario",
            constraint=models.UniqueConstraint(
                condition=models.Q(("session__isnull", True), ("trace__isnull", False)),
                fields=("run", "trace"),
                name="scenario_unique_trace",
            ),
        ),
        migrations.CreateModel(
            name="SessionRuleState",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "evaluated_activity",
                    models.DateTimeField(help_text="The session's last_activity then."),
                ),
                (
                    "evaluated_traces",
                    models.PositiveIntegerField(help_text="Its trace_count then."),
                ),
                ("fired_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "rule",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="session_states",
                        to="runs.onlinerule",
                    ),
                ),
                (
                    "scenario",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="runs.scenario",
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="runs.session",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("rule", "session"), name="session_rule_state_unique"
                    )
                ],
            },
        ),
    ]
