"""What ``run_batch`` returns for each call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(slots=True)
class CallResult:
    """The outcome of one evaluation call.

    ``status`` is ``"success"`` when evaluate() returned: ``value`` is then the raw JSON value it
    returned, or ``evaluators.normalize.Unrepresentable`` when JSON cannot carry it (NaN, a set,
    ``undefined`` ...); normalising it is the caller's job. ``"error"`` means it raised or the
    sandbox stopped it: ``error`` has ``code``, ``type``, ``message``, ``stacktrace`` (and
    ``line``/``column`` for compile errors). ``logs`` is what the call printed, bounded.
    """

    status: Literal["success", "error"]
    value: Any = None
    error: dict[str, Any] | None = None
    logs: str = ""
    duration_ms: float = 0.0


def error_result(
    code: str, message: str, *, type: str = "SandboxError", stacktrace: str = "", logs: str = ""
) -> CallResult:
    error = {"code": code, "type": type, "message": message, "stacktrace": stacktrace}
    return CallResult("error", None, error, logs, 0.0)
