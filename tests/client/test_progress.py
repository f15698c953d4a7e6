"""Progress while a run goes: plain lines in CI (on each 10 % of the cells and each change of
status, not on every poll), a bar redrawn in place on a terminal."""

from __future__ import annotations

import io

from evalsite_client.progress import Progress

from tests.client.payloads import run


def _states():
    yield run(status="queued", done_cells=0)
    for done in (0, 30, 45, 61, 62, 63, 130, 300, 599):
        yield run(status="running", done_cells=done)


def test_ci_logs_get_a_line_per_ten_percent_and_per_status_not_per_poll():
    out = io.StringIO()
    progress = Progress(stream=out, mode="lines")
    for state in _states():
        progress.update(state)
    progress.finish(run(status="success", done_cells=600))
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[2] for line in lines] == [
        "queued:",
        "running:",
        "running:",
        "running:",
        "running:",
        "running:",
        "success:",
    ]
    assert [line.split(" ")[3] for line in lines] == [
        "0%",
        "0%",
        "10%",
        "22%",
        "50%",
        "100%",
        "100%",
    ]
    assert lines[2].startswith("run #12 running: 10% (61/600 cells)")
    assert "\r" not in out.getvalue()


def test_a_quiet_run_still_gets_a_line_now_and_then():
    out = io.StringIO()
    progress = Progress(stream=out, mode="lines", heartbeat=0)
    for _ in range(3):
        progress.update(run(status="running", done_cells=5))
    assert len(out.getvalue().splitlines()) == 3


def test_a_terminal_gets_one_bar_redrawn_in_place():
    out = io.StringIO()
    progress = Progress(stream=out, mode="bar")
    for state in _states():
        progress.update(state)
    progress.finish(run(status="success", done_cells=600))
    text = out.getvalue()
    assert text.count("\r") == 11 and text.endswith("\n") and text.count("\n") == 1
    assert "\r[" + "#" * 30 + "] run #12 success: 100% (600/600 cells)" in text


def test_auto_is_a_bar_on_a_terminal_and_lines_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert Progress(stream=Terminal(), mode="auto").mode == "bar"
    assert Progress(stream=io.StringIO(), mode="auto").mode == "lines"


def test_errors_are_counted_in_the_line():
    out = io.StringIO()
    Progress(stream=out, mode="lines").finish(run(status="errors", done_cells=600, error_cells=7))
    assert "(600/600 cells, 7 errors)" in out.getvalue()
