"""Waiting for a run to end, showing how far it is: a bar redrawn in place on a terminal, plain
lines in CI logs (every 10 % of the cells, on a change of status, and at least every
``heartbeat`` seconds while nothing moves)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from evalsite_client.client import Client
from evalsite_client.models import Run

BAR_WIDTH = 30
LINE_STEP = 10.0  # percent between two plain lines


class RunTimeout(Exception):
    def __init__(self, run: Run, seconds: float) -> None:
        self.run = run
        super().__init__(f"run #{run.id} is still {run.status} after {seconds:.0f} s")


class Progress:
    """``mode``: ``bar`` (a terminal), ``lines`` (CI logs), ``none``, or ``auto`` (``bar``
    when ``stream`` is a terminal, else ``lines``)."""

    def __init__(
        self, stream: TextIO | None = None, mode: str = "auto", heartbeat: float = 30.0
    ) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        self.mode, self.heartbeat = mode, heartbeat
        self.started = time.monotonic()
        self.last_line: tuple[str, float] | None = None  # (status, percent) last printed
        self.last_time = 0.0

    def update(self, run: Run) -> None:
        if self.mode == "bar":
            self._bar(run)
        elif self.mode == "lines" and self._line_due(run):
            self._print(run)

    def finish(self, run: Run) -> None:
        if self.mode == "none":
            return
        if self.mode == "bar":
            self._bar(run)
            self.stream.write("\n")
        elif self.mode == "lines":
            self._print(run)
        self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def _line_due(self, run: Run) -> bool:
        now = time.monotonic()
        if self.last_line is None:
            return True
        status, percent = self.last_line
        moved = run.progress // LINE_STEP > percent // LINE_STEP
        quiet = now - self.last_time >= self.heartbeat
        return run.status != status or moved or quiet

    def _print(self, run: Run) -> None:
        self.stream.write(line(run, self.elapsed) + "\n")
        self.stream.flush()
        self.last_line, self.last_time = (run.status, run.progress), time.monotonic()

    def _bar(self, run: Run) -> None:
        filled = int(BAR_WIDTH * min(run.progress, 100.0) / 100)
        bar = "#" * filled + "-" * (BAR_WIDTH - filled)
        self.stream.write(f"\r[{bar}] {line(run, self.elapsed)}\x1b[K")
        self.stream.flush()


def line(run: Run, elapsed: float) -> str:
    errors = f", {run.error_cells} errors" if run.error_cells else ""
    return (
        f"run #{run.id} {run.status}: {run.progress:.0f}% "
        f"({run.done_cells}/{run.total_cells} cells{errors}) {elapsed:.0f}s"
    )


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def run_wait(
    client: Client,
    run_id: int,
    *,
    progress: Progress | None = None,
    poll: float = 1.0,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Run:
    """Poll ``GET /runs/{id}`` until the run is no longer pending, queued or running."""
    progress = progress or Progress(mode="none")
    started = time.monotonic()
    while True:
        run = client.run(run_id)
        if not run.active:
            progress.finish(run)
            return run
        progress.update(run)
        if timeout is not None and time.monotonic() - started > timeout:
            progress.finish(run)
            raise RunTimeout(run, timeout)
        sleep(poll)
