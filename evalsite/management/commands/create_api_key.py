from django.core.management.base import BaseCommand, CommandError

from evalsite.models import Project, Role
from evalsite.services import api_key_create, membership_set, project_create, user_get_or_create


class Command(BaseCommand):
    help = "Create an API key for a project (creating the project and user if needed) and print it."

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="Project slug.")
        parser.add_argument("--user", default="", help="Username that owns the key.")
        parser.add_argument("--name", default="cli", help="A label for the key.")
        parser.add_argument("--role", default=Role.EDITOR, choices=[r.value for r in Role])

    def handle(self, *args, project, user, name, role, **options):
        if not project.replace("-", "").replace("_", "").isalnum():
            raise CommandError(f"--project {project!r} is not a valid slug.")
        person = user_get_or_create(username=user) if user else None
        found = Project.objects.filter(slug=project).first()
        if found is None:
            found = project_create(name=project, slug=project, owner=person)
        elif person is not None and found.role_of(person) is None:
            membership_set(project=found, user=person, role=role)
        _, raw = api_key_create(project=found, name=name, created_by=person, role=role)
        self.stdout.write(raw)
