"""Runs logged from your own code (the SDK flow): open a run, log each scenario's inputs, outputs,
trace and evaluator outputs, close it.

    with LoggedRun(client, name="nightly", evaluators=["helpful"], tags={"branch": "main"}) as run:
        for question in questions:
            answer = my_app(question)
            run.log(inputs={"question": question}, outputs=answer, scores={"helpful": True})

Rows are sent in batches (``batch_size``). Leaving the block closes the run, which computes its
metrics; when the block raises, what was logged is kept, the run is cancelled and closed, and the
exception goes on.
"""

from __future__ import annotations

import contextlib
import traceback
from typing import Any

from evalsite_client.client import ApiError, Client
from evalsite_client.models import Run

MISSING: Any = object()
DEFAULT_APPLICATION = "sdk"


class LoggedRun:
    """``testset``: log against a testset's rows (give each row's ``index``); without one,
    every ``log`` adds a scenario. ``application``: a ``logged`` application's slug (one named
    ``sdk`` is made when none is given). ``evaluators``: the evaluators whose outputs you log
    in ``scores``."""

    def __init__(
        self,
        client: Client,
        *,
        name: str = "",
        testset: str | int | None = None,
        testset_version: int | None = None,
        application: str | None = None,
        evaluators: list[str] = (),
        tags: dict[str, str] | None = None,
        description: str = "",
        batch_size: int = 50,
    ) -> None:
        self.client = client
        self.fields = {
            "name": name,
            "testset": testset,
            "testset_version": testset_version,
            "evaluators": list(evaluators),
            "tags": tags,
            "description": description,
        }
        self.application = application
        self.batch_size = batch_size
        self.pending: list[dict[str, Any]] = []
        self.run: Run | None = None
        self.logged = 0

    # --- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> LoggedRun:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.flush()
        finally:
            self._stop(exc)

    def start(self) -> Run:
        application = _logged_application(self.client, self.application)
        self.run = self.client.run_create(**self.fields, application=application)
        self.keys = _step_keys(self.run)
        return self.run

    def close(self) -> Run:
        """Send what is left and close the run: it ends with its metrics computed."""
        self.flush()
        self.run = self.client.run_action(self._run.id, "close")
        return self.run

    def _stop(self, exc: BaseException) -> None:
        run = self._run
        note = f"Stopped: the logging code raised {type(exc).__name__}: {exc}"[:1000]
        description = f"{run.description}\n\n{note}".strip()
        with contextlib.suppress(ApiError):  # a server without PATCH: the status still says it
            self.client.run_update(run.id, description=description)
        self.client.run_action(run.id, "cancel")
        self.run = self.client.run_action(run.id, "close")

    @property
    def _run(self) -> Run:
        if self.run is None:
            raise RuntimeError("Start the run first (use `with LoggedRun(...) as run:`).")
        return self.run

    # --- logging --------------------------------------------------------------------------------

    def log(
        self,
        *,
        inputs: dict[str, Any] | None = None,
        outputs: Any = MISSING,
        trace: dict | str | None = None,
        scores: dict[str, Any] | None = None,
        error: BaseException | str | dict | None = None,
        index: int | None = None,
        duration_ms: float | None = None,
    ) -> None:
        """One scenario: its ``inputs`` (or the testset row's ``index``), the application's
        ``outputs`` and/or ``trace`` (a trace dict in evalsite's shape, or the id of a trace
        already sent), or the ``error`` it failed with; ``scores`` maps an evaluator slug to
        its outputs (a dict, a bool for ``{"success": b}``, a number for ``{"score": x}``) or to
        an exception when that evaluation failed."""
        run = self._run
        if run.testset is not None and index is None:
            raise ValueError("This run is over a testset: give the row's index.")
        if run.testset is None and index is not None:
            raise ValueError("index is for runs over a testset; give inputs instead.")
        unknown = sorted(set(scores or {}) - set(self.keys["evaluators"]))
        if unknown:
            known = ", ".join(self.keys["slugs"]) or "none"
            raise ValueError(f"No evaluator {', '.join(unknown)} in this run (it has: {known}).")
        self.pending.append(
            {
                "inputs": inputs or {},
                "outputs": outputs,
                "trace": trace,
                "scores": scores or {},
                "error": error,
                "index": index,
                "duration_ms": duration_ms,
            }
        )
        if len(self.pending) >= self.batch_size:
            self.flush()

    def flush(self) -> None:
        """Send the rows logged so far (scenarios, traces, then the cells)."""
        rows, self.pending = self.pending, []
        if not rows:
            return
        run = self._run
        new = [r for r in rows if r["index"] is None]
        if new:
            body = {"scenarios": [{"inputs": r["inputs"]} for r in new]}
            indexes = self.client.post(f"runs/{run.id}/scenarios", body)["indexes"]
            for row, index in zip(new, indexes, strict=True):
                row["index"] = index
        traces = [r["trace"] for r in rows if isinstance(r["trace"], dict)]
        if traces:
            for row in rows:
                if isinstance(row["trace"], dict) and row["outputs"] is not MISSING:
                    _outputs_into(row["trace"], row["outputs"])
            self.client.post("traces", {"traces": traces})
        results = [cell for row in rows for cell in self._cells(row)]
        self.client.post(f"runs/{run.id}/results", {"results": results})
        self.logged += len(rows)

    def _cells(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        index = row["index"]
        cells = [{"scenario": index, "step_key": self.keys["input"]}]
        invocation = {"scenario": index, "step_key": self.keys["invocation"]}
        if row["duration_ms"] is not None:
            invocation["duration_ms"] = row["duration_ms"]
        if row["error"] is not None:
            cells.append({**invocation, "error": error_body(row["error"])})
            return cells  # nothing to judge
        trace = row["trace"]
        if trace is not None:
            if isinstance(trace, dict) and not trace.get("trace_id"):
                raise ValueError(f"Scenario {index}: a trace dict needs its trace_id.")
            invocation["trace_id"] = trace["trace_id"] if isinstance(trace, dict) else str(trace)
        elif row["outputs"] is not MISSING:
            invocation["outputs"] = row["outputs"]
        else:
            raise ValueError(f"Scenario {index}: log its outputs, its trace or its error.")
        cells.append(invocation)
        for slug, value in row["scores"].items():
            cell = {"scenario": index, "step_key": self.keys["evaluators"][slug]}
            if isinstance(value, BaseException):
                cell["error"] = error_body(value)
            else:
                cell["outputs"] = score_outputs(value)
            cells.append(cell)
        return cells


def score_outputs(value: Any) -> dict[str, Any]:
    """What an evaluator returned, as outputs: a bool is ``{"success": b}``, a number
    ``{"score": x}``, a dict is kept."""
    if isinstance(value, bool):
        return {"success": value}
    if isinstance(value, int | float):
        return {"score": value}
    if isinstance(value, dict):
        return value
    raise ValueError(f"A score is a dict, a bool or a number, not {type(value).__name__}.")


def error_body(error: BaseException | str | dict) -> dict[str, Any]:
    if isinstance(error, dict):
        return error
    if isinstance(error, BaseException):
        return {
            "code": "client_error",
            "type": type(error).__name__,
            "message": str(error),
            "stacktrace": "".join(traceback.format_exception(error))[-8000:],
        }
    return {"code": "client_error", "type": "error", "message": str(error)}


def _outputs_into(trace: dict, outputs: Any) -> None:
    """The outputs the scenario table shows are the root span's ``ag.data.outputs``."""
    roots = list((trace.get("spans") or {}).values())
    if len(roots) == 1 and isinstance(roots[0], dict):
        data = roots[0].setdefault("attributes", {}).setdefault("ag", {}).setdefault("data", {})
        data.setdefault("outputs", outputs)


def _step_keys(run: Run) -> dict[str, Any]:
    inputs = run.steps_of("input")
    invocations = run.steps_of("invocation")
    if not inputs or not invocations:
        raise ValueError(f"Run #{run.id} has no input or invocation step to log into.")
    evaluators = {}
    for step in run.steps_of("annotation"):
        evaluators[step.evaluator_slug or step.key] = step.key
        evaluators.setdefault(step.key, step.key)
    return {
        "input": inputs[0].key,
        "invocation": invocations[0].key,
        "evaluators": evaluators,
        "slugs": [s.evaluator_slug or s.key for s in run.steps_of("annotation")],
    }


def _logged_application(client: Client, ref: str | None) -> str:
    """The slug of the ``logged`` application ``ref`` (id or slug); without one, the ``sdk``
    application, made when missing. Any other kind would start an engine run instead."""
    wanted = ref or DEFAULT_APPLICATION
    found = next((a for a in client.applications() if wanted in (a.slug, str(a.id))), None)
    if found is None and ref is None:
        found = client.application_create(
            name="SDK (logged from code)", slug=DEFAULT_APPLICATION, kind="logged"
        )
    if found is None:
        raise ValueError(f"No application {wanted!r} in this project.")
    if found.kind != "logged":
        raise ValueError(
            f"The application {found.slug!r} is a {found.kind} application; "
            "log into a logged one (or use `evalsite run`)."
        )
    return found.slug
