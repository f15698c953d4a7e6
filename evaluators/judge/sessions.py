"""A whole session for a judge: ``{{session}}``, ``{{session_transcript}}``, ``{{session_outline}}``.

A session (DOMAIN.md) is ``{"session_id", "traces": [trace, ...], "messages": [...]}``: its turns'
traces in time order and the conversation assembled from them. A judge reads it three ways:

- ``session``: the dict itself (JSON when rendered whole; ``{{session.messages[0].content}}``,
  ``{{$.session.traces[-1:]}}`` pick parts);
- ``session_transcript``: the conversation as text, one message per line (``user: ...``,
  ``assistant: ...``, an assistant's tool calls as ``[calls name(arguments)]``, a tool's answer
  as ``tool (name): ...``), every message in full: the words are what a judge of a conversation
  reads first;
- ``session_outline``: each turn's trace as a span outline (``evaluators.judge.outline``) under
  a ``Turn n`` header, all turns within the ``config.outline_tokens`` budget together: what the
  agent did, not only what it said.

In a session evaluation the trace fields still exist and describe the last turn: ``trace`` is
its trace, ``trace_outline`` and ``trace_summary`` are built from it.
"""

from __future__ import annotations

import json
from typing import Any

from evalsite.jsonpaths import dig
from evaluators.judge.outline import CHARS_PER_TOKEN, trace_outline

SESSION_VARIABLES = ("session", "session_transcript", "session_outline")
MIN_TURN_TOKENS = 25


def session_traces(session: Any) -> list[dict[str, Any]]:
    """The session's traces (time order), leaving out anything that is not a trace object."""
    traces = session.get("traces") if isinstance(session, dict) else None
    return [t for t in traces or [] if isinstance(t, dict)]


def last_trace(session: Any) -> dict[str, Any] | None:
    """The last turn's trace: what ``trace`` means in a session evaluation."""
    traces = session_traces(session)
    return traces[-1] if traces else None


def session_fields(session: dict[str, Any], budget: int, *, outline: bool = True) -> dict:
    """The three session variables; ``outline=False`` skips building the outline (None)."""
    messages = session.get("messages") if isinstance(session.get("messages"), list) else []
    return {
        "session": session,
        "session_transcript": session_transcript(messages),
        "session_outline": session_outline(session, budget) if outline else None,
    }


def session_transcript(messages: list[Any]) -> str:
    """The conversation as ``role: text`` lines (see the module docstring)."""
    tool_names: dict[str, str] = {}
    lines = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "?")
        text = _text(message.get("content"))
        raw_calls = message.get("tool_calls")
        calls = [c for c in raw_calls if isinstance(c, dict)] if isinstance(raw_calls, list) else []
        if calls:
            described = []
            for call in calls:
                name, arguments = _call(call)
                if isinstance(call.get("id"), str):
                    tool_names[call["id"]] = name
                described.append(f"{name}({arguments})")
            text = f"{text} [calls {', '.join(described)}]".strip()
        if role == "tool":
            name = tool_names.get(str(message.get("tool_call_id")), message.get("name") or "")
            role = f"tool ({name})" if name else "tool"
        lines.append(f"{role}: {_indented(text)}")
    return "\n".join(lines)


def session_outline(session: dict[str, Any], budget: int) -> str | None:
    """Each turn's trace outline under a ``Turn n`` header, within ``budget`` tokens in all."""
    traces = session_traces(session)
    if not traces:
        return None
    limit = budget * CHARS_PER_TOKEN
    headers = [_turn_header(number, trace) for number, trace in enumerate(traces, 1)]
    room = limit - sum(len(h) + 2 for h in headers)
    per_turn = max(room // len(traces) // CHARS_PER_TOKEN, MIN_TURN_TOKENS)
    parts = [
        f"{header}\n{trace_outline(trace, per_turn) or '(no spans)'}"
        for header, trace in zip(headers, traces, strict=True)
    ]
    text = "\n".join(parts)
    if len(text) <= limit:
        return text
    note = f"\n… {len(traces)} turns do not fit the outline budget; the session page has them all"
    return text[: max(limit - len(note), 0)] + note


def _turn_header(number: int, trace: dict[str, Any]) -> str:
    roots = [s for s in (trace.get("spans") or {}).values() if isinstance(s, dict)]
    root = roots[0] if roots else {}
    parts = [f"Turn {number}"]
    if trace.get("trace_id"):
        parts.append(f"trace {trace['trace_id']}")
    if root.get("start_time"):
        parts.append(str(root["start_time"]))
    return " · ".join(parts)


def _call(call: dict[str, Any]) -> tuple[str, str]:
    function = call.get("function") if isinstance(call.get("function"), dict) else call
    name = str(function.get("name") or "?")
    arguments = function.get("arguments", function.get("args"))
    if arguments in (None, ""):
        return name, ""
    return name, arguments if isinstance(arguments, str) else _json(arguments)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] if isinstance(dig(part, "text"), str) else _json(part) for part in content
        )
    return _json(content)


def _indented(text: str) -> str:
    # Continuation lines are indented, so every line that starts at the margin is a new message.
    return text.replace("\n", "\n  ")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
