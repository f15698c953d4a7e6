from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        from evaluators.judge import TRACE_RECORDERS
        from evaluators.samples import SAMPLE_PROVIDERS
        from runs.ingest import trace_record
        from runs.selectors import scenario_case

        # evaluators offers these hooks so that it never imports runs.
        SAMPLE_PROVIDERS.append(scenario_case)
        TRACE_RECORDERS.append(trace_record)
