from django.apps import AppConfig


class EvalsiteConfig(AppConfig):
    name = "evalsite"
    verbose_name = "Projects and access"

    def ready(self):
        from evalsite import schema  # noqa: F401  (registers OpenAPI extensions)
