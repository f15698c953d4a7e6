from typing import Any

MAX_LATENCY_MS = 2000  # edit me


def evaluate(inputs: dict[str, Any], outputs: Any, trace: dict[str, Any]) -> dict[str, Any]:
    """Succeeds when the root span's duration is within MAX_LATENCY_MS."""
    if not trace or not trace.get("spans"):
        raise ValueError("this evaluator needs the invocation trace")
    root = next(iter(trace["spans"].values()))
    latency = root["attributes"]["ag"]["metrics"]["unit"]["duration"]["total"]
    return {"latency_ms": latency, "success": latency <= MAX_LATENCY_MS}
