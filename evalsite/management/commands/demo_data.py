from django.core.management.base import BaseCommand

from evalsite.demo import DEMO_PASSWORD, DEMO_USER, demo_load


class Command(BaseCommand):
    help = (
        "Create or refresh the demo project (user demo / demo), its evaluators, testset and runs."
    )

    def handle(self, *args, **options):
        project = demo_load()
        self.stdout.write(
            f"Demo project {project.slug!r} ready; log in as {DEMO_USER} / {DEMO_PASSWORD}."
        )
