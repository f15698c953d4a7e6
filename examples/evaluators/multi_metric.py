from typing import Any


def evaluate(inputs: dict[str, Any], outputs: Any, trace: dict[str, Any]) -> dict[str, Any]:
    """Several metrics at once: each key becomes a column and a metric."""
    expected = str(inputs.get("correct_answer", "")).strip().lower()
    answer = str(outputs).strip().lower()
    exact = answer == expected
    contains = bool(expected) and expected in answer
    label = "exact" if exact else "partial" if contains else "wrong"
    score = 1.0 if exact else 0.5 if contains else 0.0
    return {"score": score, "success": exact, "label": label, "length": len(answer)}
