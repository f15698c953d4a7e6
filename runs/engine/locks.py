"""The run's row under lock, and the check that it is still open for writes."""

from __future__ import annotations

from evalsite.errors import InvalidInput
from runs.models import Run


def run_locked(run: Run) -> Run:
    """The run's current row, locked: status checks must not trust a stale object. ``FOR NO
    KEY UPDATE``: it still waits for every other writer of the row (cells' counters, a refresh),
    but not for the foreign-key checks of rows inserted under the run (results, statistics),
    which would otherwise wait for this lock while holding what its holder waits for."""
    return Run.objects.select_for_update(no_key=True).get(pk=run.pk)


def run_check_open(run: Run) -> None:
    if run.closed:
        raise InvalidInput({"run": ["This run is closed and read-only."]})
