"""Agent runs from OpenAI-style message histories and from the trace's tool spans.

A message history is a list of chat messages. Assistant messages carry ``tool_calls``
(``{"id", "type": "function", "function": {"name", "arguments"}}``, the arguments a JSON string
or an object; LangChain's flat ``{"id", "name", "args"}`` is read too), and each ``tool``
message answers one call through ``tool_call_id``. A tool result whose JSON has ``"ok": false``
or a non-empty ``"error"``, or a tool message with ``"status": "error"``, is a failed call.

The trace adds what messages cannot know: each ``kind == "tool"`` span's duration
(``ag.metrics.unit.duration.total``), status and arguments (``ag.data.inputs``). Spans are matched
to calls by tool-call id (``gen_ai.tool.call.id``) when they carry one, else by tool name in
order. Without a history the tool spans alone are the run. A call that no span timed has no
duration: nothing here makes one up.

A retry is a call of the same tool as the call right before it, in the same turn; across a
turn boundary (a session), only when that call failed: the same tool used again in the next turn
after it worked answers a new request.

A session (a whole conversation, ``session_run``) is read turn by turn: each turn's trace gives
its own history and tool spans exactly as above, a history re-sent whole each turn counts only
its new messages, and the turns' calls follow one another, each marked with its turn.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from evalsite.jsonpaths import dig
from evaluators.normalize import EvaluationError

OK, FAILED, NO_RESULT = "ok", "failed", "no_result"
AUTO = "auto"
ROOTS = ("outputs", "inputs", "trace")
# Where "auto" looks for a history, in this order (trace paths start at the root span).
AUTO_PATHS = (
    "outputs",
    "outputs.messages",
    "inputs.messages",
    "trace.ag.data.outputs.messages",
    "trace.ag.data.outputs",
    "trace.ag.data.inputs.messages",
)
ERROR_PREVIEW = 300
MISSING = object()
NOTHING: tuple[list, int, None, None] = ([], 0, None, None)  # what a scan without a trace finds
# Parsing every tool result is most of the cost of a long history; one that names neither key
# cannot have failed.
_MAY_FAIL = re.compile(r'"(?:error|ok)"')


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: Any = None
    call_id: str | None = None
    message_index: int | None = None
    span_id: str | None = None
    status: str = NO_RESULT  # ok | failed | no_result (the history ends before an answer)
    error: str | None = None
    duration_ms: float | None = None
    retry: bool = False
    turn: int | None = None  # in a session, the turn (from 1) the call belongs to

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def step(self, number: int) -> dict[str, Any]:
        step = {
            "step": number,
            "name": self.name,
            "arguments": self.arguments,
            "status": self.status,
            "error": self.error,
            "duration_ms": self.duration_ms,
            "retry": self.retry,
            "call_id": self.call_id,
            "message_index": self.message_index,
            "span_id": self.span_id,
        }
        if self.turn is not None:
            step["turn"] = self.turn
        return step


@dataclass
class AgentRun:
    calls: list[ToolCall]
    messages: list[dict] | None  # None: the run is the trace's tool spans alone
    source: str  # where the history was found ("outputs.messages"), or "trace"
    task: str = ""
    final_answer: str = ""  # the closing assistant text; without a history, the root's output
    chars: int = 0  # characters of the history, for the token estimate
    tokens_peak: int | None = None  # the largest single span's token total
    tokens_total: int | None = None  # the whole trace's

    @property
    def failed_calls(self) -> int:
        return sum(call.status == FAILED for call in self.calls)

    @property
    def retries(self) -> int:
        return sum(call.retry for call in self.calls)

    def steps(self) -> list[dict[str, Any]]:
        return [call.step(number) for number, call in enumerate(self.calls, 1)]


@dataclass
class History:
    calls: list[ToolCall]
    task: str
    final_answer: str
    chars: int


# --- the whole run ------------------------------------------------------------------------------


def agent_run(
    *,
    inputs: dict[str, Any],
    outputs: Any,
    trace: dict[str, Any] | None,
    messages_path: str = AUTO,
    use_trace: bool = True,
) -> AgentRun:
    """The run an evaluation sees: the history at ``messages_path`` merged with the trace's tool
    spans. Raises ``EvaluationError`` for a malformed history or when there is no run at all."""
    messages, source = find_history(messages_path, inputs, outputs, trace)
    spans, span_chars, peak, total = [], 0, None, None
    if use_trace:
        spans, span_chars, peak, total = _scan(trace, count_chars=messages is None)
    if messages is not None:
        history = read_history(messages, source)
        calls = merge(history.calls, spans)
        run = AgentRun(
            calls, messages, source, history.task, history.final_answer, history.chars, peak, total
        )
    elif spans:
        root = _root_data(trace)
        answer = root.get("outputs") if _root_ok(trace) else None
        chars = span_chars + _chars(root.get("inputs")) + _chars(answer)
        run = AgentRun(
            spans, None, "trace", plain(root.get("inputs")), plain(answer), chars, peak, total
        )
    else:
        raise _no_run(trace, use_trace)
    run.task = run.task or plain(inputs)
    mark_retries(run.calls)
    return run


def session_run(
    *, session: dict[str, Any], messages_path: str = AUTO, use_trace: bool = True
) -> AgentRun:
    """The agent run of a whole conversation (DOMAIN.md's session dict).

    Calls come turn by turn: a turn's history (found at ``messages_path`` in its root span's
    inputs and outputs, as for one trace) gives its calls, merged with its own tool spans; a
    turn without calls in a history is its tool spans. A history that repeats the previous
    turn's (a chat client re-sending the conversation) counts only what it adds, and a call
    whose id an earlier turn already had is not counted again. The
    conversation judged (task, final answer, size) is ``session["messages"]``, or the turns'
    histories when it has none. Tokens: the largest single span of any turn, and all turns'.
    """
    traces = [t for t in session.get("traces") or [] if isinstance(t, dict)]
    calls: list[ToolCall] = []
    histories: list[dict] = []
    previous: list = []
    seen: set[str] = set()  # call ids of earlier turns
    peaks, totals, chars = [], [], 0
    for turn, trace in enumerate(traces, 1):
        data = _root_data(trace)
        inputs = data.get("inputs") if isinstance(data.get("inputs"), dict) else {}
        history, source = _turn_history(messages_path, inputs, data.get("outputs"), trace, turn)
        spans, span_chars, peak, total = _scan(trace, count_chars=True) if use_trace else NOTHING
        chars += span_chars + _chars(data.get("inputs")) + _chars(data.get("outputs"))
        turn_calls: list[ToolCall] = []
        if history is not None:
            read = read_history(history, f"session.traces[{turn - 1}].{source}")
            repeated = len(previous) if previous and history[: len(previous)] == previous else 0
            turn_calls = [
                c
                for c in read.calls
                if (c.message_index or 0) >= repeated
                and (c.call_id is None or c.call_id not in seen)
            ]
            histories.extend(history[repeated:])
            previous = history
        turn_calls = merge(turn_calls, spans) if turn_calls else spans
        for call in turn_calls:
            call.turn = turn
        seen.update(c.call_id for c in turn_calls if c.call_id)
        calls.extend(turn_calls)
        peaks.append(peak)
        totals.append(total)
    messages = session.get("messages")
    conversation = messages if isinstance(messages, list) and messages else histories
    if not traces and conversation:  # a session given as messages alone
        calls = read_history(conversation, "session.messages").calls
    if not calls and not conversation:
        raise EvaluationError(
            f"No agent run in this session: its {len(traces)} turn(s) have no message history "
            f"(looked at {', '.join(AUTO_PATHS) if messages_path == AUTO else messages_path}) "
            "and no tool spans, and the session has no messages.",
            code="missing_history",
        )
    summary = read_history(conversation, "session.messages") if conversation else None
    known_peaks = [p for p in peaks if p is not None]
    known_totals = [t for t in totals if t is not None]
    run = AgentRun(
        calls,
        conversation or None,
        "session",
        summary.task if summary else "",
        summary.final_answer if summary else "",
        summary.chars if summary else chars,
        max(known_peaks) if known_peaks else None,
        sum(known_totals) if known_totals else None,
    )
    if not run.task and traces:
        run.task = plain(_root_data(traces[0]).get("inputs"))
    mark_retries(run.calls)
    return run


def _turn_history(
    path: str, inputs: dict[str, Any], outputs: Any, trace: dict, turn: int
) -> tuple[list | None, str]:
    """One turn's history; a turn without one (at an explicit path too) is its spans alone."""
    try:
        return find_history(path, inputs, outputs, trace)
    except EvaluationError as exc:
        if exc.code == "missing_history":
            return None, ""
        raise EvaluationError(f"Turn {turn}: {exc.message}", code=exc.code) from None


def trajectory_summary(
    history: list | dict | None = None, trace: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The steps of an agent run, for the run drill-in page.

    ``history`` is a message list (or ``{"messages": [...]}``); a trace may come instead of it or
    beside it (``trajectory_summary(trace)`` works). Each step: ``step`` (from 1), ``name``,
    ``arguments``, ``status`` (ok, failed, no_result), ``error``, ``duration_ms`` (None when the
    trace did not time it), ``retry``, ``call_id``, ``message_index``, ``span_id``. Raises
    ``EvaluationError`` for a malformed history.
    """
    if isinstance(history, dict) and "spans" in history and trace is None:
        history, trace = None, history
    if isinstance(history, dict):
        history = history.get("messages")
    spans = tool_spans(trace)[0] if trace else []
    calls = merge(read_history(history, "messages").calls, spans) if history is not None else spans
    mark_retries(calls)
    return [call.step(number) for number, call in enumerate(calls, 1)]


def _no_run(trace: Any, use_trace: bool) -> EvaluationError:
    # Only "auto" gets here: an explicit path that holds nothing has already been reported.
    spans = ""
    if use_trace:
        spans = " and the trace has no tool spans" if root_span(trace) else " and there is no trace"
    looked = ", ".join(AUTO_PATHS)
    return EvaluationError(
        f"No agent run to evaluate: no message history at {looked}{spans}. Set messages_path "
        f"to where your application puts its messages.",
        code="missing_history",
    )


# --- where the history is ----------------------------------------------------------------------


def check_path(path: str) -> str:
    """Validate a ``messages_path`` setting; raises ValueError with a readable reason."""
    if path == AUTO:
        return path
    head, *rest = path.split(".")
    if head not in ROOTS or any(not part for part in rest):
        raise ValueError(
            "use auto, or a dotted path that starts with outputs, inputs or trace "
            "(outputs.messages, inputs.messages, trace.ag.data.outputs.messages)"
        )
    return path


def find_history(
    path: str, inputs: dict[str, Any], outputs: Any, trace: Any
) -> tuple[list | None, str]:
    """(messages, where they were found); (None, "") when ``auto`` finds none."""
    if path != AUTO:
        value = resolve(path, inputs, outputs, trace)
        if value is MISSING:
            raise EvaluationError(
                f"No message history at {path}: the path does not exist.", code="missing_history"
            )
        if not isinstance(value, list):
            raise EvaluationError(
                f"{path}: expected a list of messages, got {_type(value)}.",
                code="malformed_history",
            )
        return value, path
    for candidate in AUTO_PATHS:
        value = resolve(candidate, inputs, outputs, trace)
        if _looks_like_history(value):
            return value, candidate
    return None, ""


def resolve(path: str, inputs: dict[str, Any], outputs: Any, trace: Any) -> Any:
    """The value at a dotted path under outputs, inputs or the trace's root span; MISSING when
    there is none. ``trace.ag...`` reads the root span's attributes. JSON strings are opened."""
    head, _, rest = path.partition(".")
    if head == "trace":
        root = root_span(trace)
        if root is None:
            return MISSING
        value: Any = root.get("attributes") if rest.split(".")[0] == "ag" else root
    else:
        value = outputs if head == "outputs" else inputs
    for part in rest.split(".") if rest else ():
        value = _opened(value)
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and _index_in(part, value):
            value = value[int(part)]
        else:
            return MISSING
    return _opened(value)


def _index_in(part: str, items: list) -> bool:
    return part.lstrip("-").isdecimal() and -len(items) <= int(part) < len(items)


def _opened(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _looks_like_history(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[0], dict)
        and isinstance(value[0].get("role"), str)
    )


# --- messages -----------------------------------------------------------------------------------


def read_history(messages: Any, where: str) -> History:
    """Tool calls, task, closing answer and size of a history, in one pass.

    Raises ``EvaluationError`` naming the first malformed place
    (``outputs.messages[3].tool_calls[0].function.arguments: not valid JSON (...)``).
    """
    if not isinstance(messages, list):
        raise _malformed(where, f"expected a list of messages, got {_type(messages)}")
    calls: list[ToolCall] = []
    pending: dict[str, deque[ToolCall]] = {}
    task = final = ""
    chars = 0
    for index, message in enumerate(messages):
        at = f"{where}[{index}]"
        if not isinstance(message, dict):
            raise _malformed(at, f"expected a message object, got {_type(message)}")
        role = message.get("role")
        if not isinstance(role, str):
            raise _malformed(f"{at}.role", "missing" if role is None else "expected a string")
        text = _text(message.get("content"))
        chars += len(text)
        final = ""
        if role == "assistant" and message.get("tool_calls"):
            chars += _read_calls(message["tool_calls"], at, index, calls, pending)
        elif role == "assistant":
            final = text.strip()
        elif role == "tool":
            _answer(message, text, at, pending)
        elif role == "user" and not task:
            task = text
    return History(calls, task, final, chars)


def _read_calls(raw_calls: Any, at: str, index: int, calls: list[ToolCall], pending: dict) -> int:
    if not isinstance(raw_calls, list):
        raise _malformed(f"{at}.tool_calls", f"expected a list, got {_type(raw_calls)}")
    chars = 0
    for position, raw in enumerate(raw_calls):
        call, size = _call(raw, f"{at}.tool_calls[{position}]", index)
        calls.append(call)
        chars += len(call.name) + size
        if call.call_id is not None:
            pending.setdefault(call.call_id, deque()).append(call)
    return chars


def _call(raw: Any, at: str, index: int) -> tuple[ToolCall, int]:
    if not isinstance(raw, dict):
        raise _malformed(at, f"expected a tool call object, got {_type(raw)}")
    function = raw.get("function")
    if function is not None:
        if not isinstance(function, dict):
            raise _malformed(f"{at}.function", f"expected an object, got {_type(function)}")
        name, arguments = function.get("name"), function.get("arguments")
        name_at, arguments_at = f"{at}.function.name", f"{at}.function.arguments"
    else:  # LangChain's flat shape
        name, arguments = raw.get("name"), raw.get("args", raw.get("arguments"))
        name_at, arguments_at = f"{at}.name", f"{at}.args"
    if not isinstance(name, str) or not name.strip():
        raise _malformed(name_at, "missing" if name is None else "expected a non-empty string")
    call_id = raw.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise _malformed(f"{at}.id", f"expected a string, got {_type(call_id)}")
    parsed, size = _arguments(arguments, arguments_at)
    return ToolCall(name, parsed, call_id or None, message_index=index), size


def _arguments(arguments: Any, at: str) -> tuple[Any, int]:
    """(parsed arguments, characters they take in the context)."""
    if arguments is None or arguments == "":
        return {}, 0
    if isinstance(arguments, str):
        try:
            return json.loads(arguments), len(arguments)
        except ValueError as exc:
            reason = getattr(exc, "msg", str(exc))
            position = getattr(exc, "pos", None)
            where = f" at character {position}" if position is not None else ""
            raise _malformed(at, f"not valid JSON ({reason}{where})")
    if isinstance(arguments, dict | list):
        return arguments, _chars(arguments)
    raise _malformed(at, f"expected a JSON string or an object, got {_type(arguments)}")


def _answer(message: dict, text: str, at: str, pending: dict[str, deque[ToolCall]]) -> None:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _malformed(f"{at}.tool_call_id", "missing: a tool message names the call it answers")
    queue = pending.get(call_id)
    if not queue:
        raise _malformed(f"{at}.tool_call_id", f"{call_id!r} matches no earlier unanswered call")
    call = queue.popleft()
    if message.get("status") == "error":
        call.error = _preview(text) or "status: error"
    else:
        call.error = result_error(text)
    call.status = FAILED if call.error is not None else OK


def result_error(result: Any) -> str | None:
    """What went wrong, when a tool result says it failed (``ok: false`` or an ``error``)."""
    data = result
    if isinstance(result, str):
        stripped = result.lstrip()
        if not stripped.startswith("{") or not _MAY_FAIL.search(stripped):
            return None
        try:
            data = json.loads(stripped)
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if error is None or error is False or error == "" or error == [] or error == {}:
        return "ok: false" if data.get("ok") is False else None
    return _preview(error)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else json.dumps(part, default=str)
            for part in content
        )
    return json.dumps(content, default=str)


def plain(value: Any) -> str:
    """A value as the text a person (or a judge) reads."""
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _chars(value: Any) -> int:
    return len(plain(value))


def _preview(value: Any) -> str:
    text = plain(value)
    return text if len(text) <= ERROR_PREVIEW else text[: ERROR_PREVIEW - 1] + "…"


def _malformed(at: str, problem: str) -> EvaluationError:
    return EvaluationError(f"{at}: {problem}.", code="malformed_history")


def _type(value: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }
    if value is None:
        return "null"
    return names.get(type(value), f"a {type(value).__name__}")


# --- the trace ----------------------------------------------------------------------------------


def root_span(trace: Any) -> dict[str, Any] | None:
    spans = trace.get("spans") if isinstance(trace, dict) else None
    if not isinstance(spans, dict) or not spans:
        return None
    root = next(iter(spans.values()))
    return root if isinstance(root, dict) else None


def _root_data(trace: Any) -> dict[str, Any]:
    data = dig(root_span(trace), "attributes.ag.data")
    return data if isinstance(data, dict) else {}


def _root_ok(trace: Any) -> bool:
    root = root_span(trace) or {}
    return root.get("status", "ok") != "error"


def spans_in_order(trace: Any) -> Iterator[dict[str, Any]]:
    """Every span, depth first, siblings by start time."""
    spans = trace.get("spans") if isinstance(trace, dict) else None
    if not isinstance(spans, dict):
        return
    stack = _ordered(spans)
    while stack:
        span = stack.pop()
        yield span
        children = span.get("children")
        if isinstance(children, dict):
            stack.extend(_ordered(children))


def _ordered(spans: dict) -> list[dict]:
    """Spans by start time, reversed for a stack."""
    found = [span for span in spans.values() if isinstance(span, dict)]
    found.sort(key=lambda span: str(span.get("start_time") or ""), reverse=True)
    return found


def tool_spans(trace: Any) -> tuple[list[ToolCall], int]:
    """(a call per ``kind == "tool"`` span, characters of their inputs and outputs)."""
    calls, chars, _, _ = _scan(trace, count_chars=True)
    return calls, chars


def trace_tokens(trace: Any) -> tuple[int | None, int | None]:
    """(the largest single span's token total, the whole trace's); None where not recorded."""
    _, _, peak, total = _scan(trace, count_chars=False)
    return peak, total


def _scan(trace: Any, *, count_chars: bool) -> tuple[list[ToolCall], int, int | None, int | None]:
    """One walk over the trace: tool calls, their characters, peak and total tokens."""
    calls: list[ToolCall] = []
    chars = 0
    peak: float | None = None
    units = 0.0
    for span in spans_in_order(trace):
        attributes = span.get("attributes")
        attributes = attributes if isinstance(attributes, dict) else {}
        ag = attributes.get("ag")
        ag = ag if isinstance(ag, dict) else {}
        unit = dig(ag, "metrics.unit")
        unit = unit if isinstance(unit, dict) else {}
        tokens = _number(dig(unit, "tokens.total"))
        if tokens is not None:
            peak = tokens if peak is None else max(peak, tokens)
            units += tokens
        if span.get("kind") != "tool":
            continue
        data = ag.get("data")
        data = data if isinstance(data, dict) else {}
        calls.append(_span_call(span, attributes, data, _number(dig(unit, "duration.total"))))
        if count_chars:
            chars += _chars(data.get("inputs")) + _chars(data.get("outputs"))
    return calls, chars, _int(peak), _int(_total_tokens(trace, units if peak is not None else None))


def _span_call(span: dict, attributes: dict, data: dict, duration: float | None) -> ToolCall:
    if span.get("status") == "error":
        error = _preview(span.get("status_message") or "") or "status: error"
    else:
        error = result_error(data.get("outputs"))
    internals = data.get("internals")
    call_id = attributes.get("gen_ai.tool.call.id") or (
        internals.get("tool_call_id") if isinstance(internals, dict) else None
    )
    return ToolCall(
        name=str(attributes.get("gen_ai.tool.name") or span.get("name") or "?"),
        arguments=data.get("inputs"),
        call_id=str(call_id) if call_id else None,
        span_id=span.get("span_id"),
        status=FAILED if error is not None else OK,
        error=error,
        duration_ms=duration,
    )


def _total_tokens(trace: Any, units: float | None) -> float | None:
    """The roots' accumulated totals; the sum of the spans' own when no root has one."""
    spans = trace.get("spans") if isinstance(trace, dict) else None
    roots = spans.values() if isinstance(spans, dict) else ()
    accs = [_number(dig(r, "attributes.ag.metrics.acc.tokens.total")) for r in roots]
    known = [acc for acc in accs if acc is not None]
    return sum(known) if known else units


def merge(calls: list[ToolCall], spans: list[ToolCall]) -> list[ToolCall]:
    """Durations, span ids and failures of the tool spans, put on the history's calls.

    A span goes to the call with its tool-call id, else to the next call of its tool name.
    The history decides the sequence; spans no call claims are left out.
    """
    if not spans:
        return calls
    by_id = {span.call_id: span for span in spans if span.call_id}
    claimed: set[int] = set()
    unmatched: list[ToolCall] = []
    for call in calls:
        span = by_id.get(call.call_id) if call.call_id else None
        if span is not None and id(span) not in claimed:
            claimed.add(id(span))
            _take(call, span)
        else:
            unmatched.append(call)
    queues: dict[str, deque[ToolCall]] = {}
    for span in spans:
        if id(span) not in claimed:
            queues.setdefault(span.name, deque()).append(span)
    for call in unmatched:
        queue = queues.get(call.name)
        if queue:
            _take(call, queue.popleft())
    return calls


def _take(call: ToolCall, span: ToolCall) -> None:
    call.duration_ms = span.duration_ms
    call.span_id = span.span_id
    if span.failed:
        call.status, call.error = FAILED, call.error or span.error
    elif call.status == NO_RESULT:
        call.status = span.status


def mark_retries(calls: list[ToolCall]) -> None:
    previous = None
    for call in calls:
        call.retry = (
            previous is not None
            and call.name == previous.name
            and (call.turn == previous.turn or previous.failed)
        )
        previous = call


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _int(value: float | None) -> int | None:
    return None if value is None else math.ceil(value)
