from django.core.management.base import BaseCommand, CommandError

from evaluators.services import secrets_rotate
from runs.applications import application_secrets_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every stored secret (model API keys, webhook and HTTP application header "
        "values) under the first key of EVALSITE_ENCRYPTION_KEY. Run it after putting a new key "
        "first; once it succeeds, the old keys can be removed."
    )

    def handle(self, *args, **options):
        reports = [secrets_rotate(), application_secrets_rotate()]
        for report in reports:
            for what, count in report["rotated"].items():
                self.stdout.write(f"{what}: {count} re-encrypted")
        failed = [item for report in reports for item in report["failed"]]
        if failed:
            raise CommandError(
                f"No configured key decrypts {len(failed)} value(s), left as they are: "
                f"{', '.join(failed)}. Add the key they were encrypted with to "
                f"EVALSITE_ENCRYPTION_KEY (after the new one) and run this again, or enter them again."
            )
