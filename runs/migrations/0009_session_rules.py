# Placeholder: online rules that target sessions (being written).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_spans_partitioned")]
    operations = []
