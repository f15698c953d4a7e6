from django.core.management.base import BaseCommand

from evalsite.management.projects import project_scope
from runs.metrics import runs_unpacked, values_pack


class Command(BaseCommand):
    help = (
        "Pack finished runs' read models for comparisons (what the refresh at a run's end does): "
        "the runs without packs of their last refresh, such as runs that finished before packs "
        "existed. --dry-run only lists them. docs/compare.md, 'Per-scenario values'."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="Change nothing; list.")
        parser.add_argument("--project", default="", help="Only this project (its slug).")

    def handle(self, *args, dry_run, project, **options):
        scope = project_scope(project)
        runs = list(runs_unpacked(project=scope))
        if not runs:
            self.stdout.write("Nothing to pack: every finished run has packs of its last refresh.")
        for run in runs:
            if dry_run:
                self.stdout.write(f"Would pack run {run.pk} ({run.name})")
            else:
                packs = values_pack(run=run)
                self.stdout.write(f"Packed run {run.pk} ({run.name}): {packs} pack(s)")
