import logging

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db.models.signals import post_migrate

from evaluators.sandbox import register_runner, sandbox_status

logger = logging.getLogger("evaluators")


class EvaluatorsConfig(AppConfig):
    name = "evaluators"

    def ready(self):
        # Registration, here because kinds and services load the models, which exist only now.
        from evaluators import kinds  # noqa: F401  (registers every kind)
        from evaluators.sandbox_celery import CeleryRunner
        from evaluators.services import presets_sync

        post_migrate.connect(lambda **kwargs: presets_sync(), sender=self, weak=False)
        register_runner("celery", CeleryRunner())
        checks.register(check_code_runner)
        report_code_runner()


def check_code_runner(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``manage.py check`` (and runserver) name why code evaluators cannot run here, and say
    when jailed code runs as host root."""
    if settings.EVALSITE_CODE_RUNNER == "celery":
        return []  # the code workers' business
    status = sandbox_status(probe=False)
    hint = "Every code evaluation fails until this is fixed; see docs/sandbox.md."
    if not status.get("available"):
        runner = status.get("runner") or settings.EVALSITE_CODE_RUNNER
        message = (
            f"Code evaluators cannot run: the {runner} runner is unavailable: {status['problem']}"
        )
        return [checks.Warning(message, hint=hint, id="evaluators.W001")]
    return [
        checks.Warning(f"Code sandbox: {warning}", id="evaluators.W002")
        for warning in status.get("warnings", [])
    ]


def report_code_runner() -> None:
    """Say at start-up, loudly, when code evaluators cannot run here or run without a sandbox."""
    if settings.EVALSITE_CODE_RUNNER == "celery":
        # The sandbox is the code workers' business; each one checks its own when it starts.
        logger.info("Code evaluators run on Celery workers consuming the 'code' queue.")
        return
    status = sandbox_status(probe=False)  # files only: no jailed worker at every start-up
    if not status.get("available"):
        logger.error(
            "Code evaluators cannot run: the %s runner is unavailable: %s. Every code evaluation "
            "will fail until this is fixed (docs/sandbox.md).",
            status.get("runner") or settings.EVALSITE_CODE_RUNNER,
            status.get("problem"),
        )
    elif status.get("warning"):
        logger.warning(
            "!!! %s: evaluator code can read this server's files, environment and network. "
            "Use it only on a trusted single-user install. !!!",
            status["warning"],
        )
    for warning in status.get("warnings", []):
        logger.warning("Code sandbox: %s", warning)
