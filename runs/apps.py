from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"

    def ready(self):
        from evaluators.judge.traces import TRACE_RECORDERS
        from evaluators.samples import SAMPLE_PROVIDERS
        from runs.selectors import scenario_case
        from runs.traces import trace_record

        # evaluators offers these hooks so that it never imports runs.
        SAMPLE_PROVIDERS.append(scenario_case)
        TRACE_RECORDERS.append(trace_record)
