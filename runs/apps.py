from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        from evaluators.samples import SAMPLE_PROVIDERS
        from runs.selectors import scenario_case

        SAMPLE_PROVIDERS.append(scenario_case)
