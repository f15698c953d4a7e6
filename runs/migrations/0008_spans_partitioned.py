# Placeholder: the spans table becomes partitioned by trace_time here (being written).
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_sessions_trace_time")]
    operations = []
