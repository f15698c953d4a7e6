from typing import Any

TOKEN_BUDGET = 1000  # edit me


def evaluate(inputs: dict[str, Any], outputs: Any, trace: dict[str, Any]) -> dict[str, Any]:
    """Succeeds when the whole trace (root plus descendants) used at most TOKEN_BUDGET tokens."""
    if not trace or not trace.get("spans"):
        raise ValueError("this evaluator needs the invocation trace")
    root = next(iter(trace["spans"].values()))
    tokens = root["attributes"]["ag"]["metrics"]["acc"]["tokens"]["total"]
    return {"tokens": tokens, "success": tokens <= TOKEN_BUDGET}
