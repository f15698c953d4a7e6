"""Keeping a few child processes running: the web server and the Celery workers that
``manage.py up`` starts. A child that exits is started again after a pause that doubles with
each exit in a row (1 s, 2 s, 4 s ... at most 30 s), so one worker killed by the kernel's
out-of-memory killer does not take the site down with it. A child that keeps exiting (a port
taken, a broken setting: ``GIVE_UP_AFTER`` exits within ``WINDOW_SECONDS``) stops the site
instead, with the reason, rather than restarting for ever."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

GIVE_UP_AFTER = 5
WINDOW_SECONDS = 60.0
FIRST_DELAY_SECONDS = 1.0
MAX_DELAY_SECONDS = 30.0
STOP_SECONDS = 15.0  # how long a child may take to stop after SIGTERM before it is killed


@dataclass
class Child:
    name: str
    start: Callable[[], subprocess.Popen]
    process: subprocess.Popen | None = None
    exits: list[float] = field(default_factory=list)  # when it exited (monotonic), recent ones
    restart_at: float | None = None


class Supervisor:
    def __init__(
        self,
        children: list[tuple[str, Callable[[], subprocess.Popen]]],
        *,
        log: Callable[[str], None] = print,
        give_up_after: int = GIVE_UP_AFTER,
        window: float = WINDOW_SECONDS,
        first_delay: float = FIRST_DELAY_SECONDS,
        max_delay: float = MAX_DELAY_SECONDS,
    ):
        self.children = [Child(name, start) for name, start in children]
        self.log = log
        self.give_up_after = give_up_after
        self.window = window
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.stopping = threading.Event()
        self.failed: str | None = None  # why the site stopped, when a child kept exiting

    def run(self, poll: float = 0.5) -> int:
        """Start the children and keep them running until ``stop()`` (or Ctrl-C); then stop
        them all. Returns 0, or 1 when a child kept exiting."""
        try:
            for child in self.children:
                child.process = child.start()
            while not self.stopping.is_set() and self.step(time.monotonic()):
                self.stopping.wait(poll)
        except KeyboardInterrupt:
            pass
        finally:
            self._stop_children()
        return 1 if self.failed else 0

    def stop(self, *_) -> None:
        """Ask ``run`` to stop (a signal handler may call it)."""
        self.stopping.set()

    def step(self, now: float) -> bool:
        """One look at the children: note the ones that exited, start the ones due. False when
        one of them exited too often to go on."""
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                code = child.process.returncode
                child.process = None
                child.exits = [t for t in child.exits if now - t < self.window] + [now]
                if len(child.exits) >= self.give_up_after:
                    self.failed = (
                        f"{child.name} exited {len(child.exits)} times within "
                        f"{self.window:.0f} s (last exit code {code}); stopping the site"
                    )
                    self.log(self.failed)
                    return False
                delay = min(self.first_delay * 2 ** (len(child.exits) - 1), self.max_delay)
                child.restart_at = now + delay
                self.log(f"{child.name} exited with code {code}; starting it again in {delay:g} s")
            if child.process is None and child.restart_at is not None and now >= child.restart_at:
                child.process = child.start()
                child.restart_at = None
        return True

    def _stop_children(self) -> None:
        running = [c.process for c in self.children if c.process and c.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
