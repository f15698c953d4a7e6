import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("evalsite", "0002_run_tags_cost_cap")]

    operations = [
        migrations.AddField(
            model_name="project",
            name="trace_retention_days",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Whole days (plus today) its traces are kept; empty: the site's "
                "EVALSITE_TRACE_RETENTION_DAYS.",
                null=True,
                validators=[
                    django.core.validators.MinValueValidator(1),
                    django.core.validators.MaxValueValidator(36500),
                ],
            ),
        ),
    ]
