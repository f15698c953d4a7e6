from typing import Any


def evaluate(
    app_params: dict[str, Any], inputs: dict[str, Any], output: Any, correct_answer: Any
) -> float:
    """Legacy interface v1: the ground truth arrives as correct_answer (inputs[correct_answer_key])."""
    return 1.0 if str(output).strip() == str(correct_answer).strip() else 0.0
