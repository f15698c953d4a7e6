"""Agent histories and traces for the agent kinds' tests, and the example runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents"


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def call(call_id: str, name: str, arguments: Any = None) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def assistant(*calls: dict, content: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def result(call_id: str, payload: Any = None) -> dict[str, Any]:
    content = payload if isinstance(payload, str) else json.dumps(payload or {"ok": True})
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def history(*steps, task: str = "Find the capital of France.", answer: str = "") -> list[dict]:
    """A user task, then per step an assistant call and its result, then the answer if any.

    A step is a tool name, or (name, arguments), or (name, arguments, result payload).
    """
    messages: list[dict] = [{"role": "user", "content": task}]
    for index, step in enumerate(steps, 1):
        name, arguments, payload = (step, {}, None) if isinstance(step, str) else (*step, None)[:3]
        messages += [assistant(call(f"c{index}", name, arguments)), result(f"c{index}", payload)]
    if answer:
        messages.append({"role": "assistant", "content": answer})
    return messages


def span(
    span_id: str,
    name: str,
    kind: str = "tool",
    *,
    start: str = "2026-11-20T10:00:00.000Z",
    duration: float | None = None,
    status: str = "ok",
    message: str = "",
    inputs: Any = None,
    outputs: Any = None,
    tokens: int | None = None,
    call_id: str | None = None,
    children: tuple[dict, ...] = (),
) -> dict[str, Any]:
    unit: dict[str, Any] = {}
    if duration is not None:
        unit["duration"] = {"total": duration}
    if tokens is not None:
        unit["tokens"] = {"prompt": tokens - 10, "completion": 10, "total": tokens}
    attributes: dict[str, Any] = {
        "ag": {"data": {"inputs": inputs, "outputs": outputs}, "metrics": {"unit": unit}}
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    found = {
        "span_id": span_id,
        "name": name,
        "kind": kind,
        "start_time": start,
        "status": status,
        "attributes": attributes,
        "children": {child["span_id"]: child for child in children},
    }
    if message:
        found["status_message"] = message
    return found


def trace(*children: dict, inputs: Any = None, outputs: Any = None, acc_tokens=None) -> dict:
    root = span("root", "agent", "agent", inputs=inputs, outputs=outputs, children=children)
    if acc_tokens is not None:
        root["attributes"]["ag"]["metrics"]["acc"] = {"tokens": {"total": acc_tokens}}
    return {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "spans": {"root": root}}


def at(second: int) -> str:
    return f"2026-11-20T10:00:{second:02d}.000Z"
