import json
from typing import Any


def evaluate(inputs: dict[str, Any], outputs: Any, trace: dict[str, Any]) -> bool:
    """Succeeds when the output is JSON (an object or array, or a string that parses as one)."""
    if isinstance(outputs, (dict, list)):
        return True
    try:
        return isinstance(json.loads(outputs), (dict, list))
    except (TypeError, ValueError):
        return False
