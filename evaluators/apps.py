from django.apps import AppConfig


class EvaluatorsConfig(AppConfig):
    name = "evaluators"

    def ready(self):
        from django.db.models.signals import post_migrate

        from evaluators import kinds  # noqa: F401  (registers every kind)
        from evaluators.services import presets_sync

        post_migrate.connect(lambda **kwargs: presets_sync(), sender=self, weak=False)
