"""The run's row under lock, and the check that it is still open for writes."""

from __future__ import annotations

from evalsite.errors import InvalidInput
from runs.models import Run


def run_locked(run: Run) -> Run:
    """The run's current row, locked: status checks must not trust a stale object."""
    return Run.objects.select_for_update().get(pk=run.pk)


def run_check_open(run: Run) -> None:
    if run.closed:
        raise InvalidInput({"run": ["This run is closed and read-only."]})
