from typing import Any


def evaluate(inputs: dict[str, Any], outputs: Any, trace: dict[str, Any]) -> float:
    """Return a score (0..1), a bool, or a dict of metrics."""
    if outputs == inputs.get("correct_answer"):
        return 1.0
    return 0.0
