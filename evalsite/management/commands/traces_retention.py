import json

from django.core.management.base import BaseCommand

from evalsite.management.projects import project_scope
from runs.traces import Retention, partitions_ensure, retention_apply, retention_plan


class Command(BaseCommand):
    help = (
        "Apply trace retention now (what the beat does every hour): drop the span partitions "
        "nobody keeps anything in, delete each project's production traces (api, otlp) older "
        "than its retention; traces recorded by runs stay with their runs. "
        "--dry-run only says what would go. docs/traces.md, 'Partitions and retention'."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Change nothing; report.")
        parser.add_argument("--project", default="", help="Only this project (its slug).")
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="Print the report as JSON."
        )

    def handle(self, *args, dry_run, project, as_json, **options):
        scope = project_scope(project)
        if dry_run:
            report = retention_plan(project=scope)
        else:
            partitions_ensure()
            report = retention_apply(project=scope)
        self.stdout.write(_json(report) if as_json else _text(report))


def _json(report: Retention) -> str:
    return json.dumps(report.as_dict(), indent=2)


def _text(report: Retention) -> str:
    if report.skipped:
        return f"Nothing done: {report.skipped}."
    verb = "Would drop" if report.dry_run else "Dropped"
    lines = [f"{verb} {len(report.partitions)} partition(s) of runs_span"]
    lines += [f"  {p.name}  {p.start:%Y-%m-%d}" for p in report.partitions]
    verb = "would lose" if report.dry_run else "lost"
    for row in report.projects:
        if row.days is None:
            lines.append(f"{row.slug}: keeps its traces forever")
            continue
        lines.append(
            f"{row.slug}: {verb} {row.traces} production trace(s), {row.spans} span(s) older "
            f"than {row.cutoff:%Y-%m-%d} ({row.days} days); oldest kept: "
            f"{row.oldest_kept.isoformat() if row.oldest_kept else 'none'}; "
            f"{row.run_traces} older trace(s) recorded by runs are kept"
        )
    if report.default_rows:
        lines.append(
            f"{report.default_rows} span(s) sit in runs_span_default: a day's partition was "
            "missing when they arrived (is the beat running?)"
        )
    return "\n".join(lines)
