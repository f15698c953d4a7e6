"""A run's tool calls against a reference trajectory (as LangChain agentevals, DeepEval, Ragas).

Modes:

- ``strict``: the same calls in the same order, no more, no fewer;
- ``unordered``: the same calls, any order (each reference step used once);
- ``subset``: every call the agent made is in the reference (it may skip some);
- ``superset``: every reference step was called (the agent may do more);
- ``in_order``: every reference step was called, in the reference's order, other calls between.

Arguments are compared ``exact``-ly, as a ``subset`` (every argument the reference names has the
reference's value; nested objects likewise), or ``ignore``-d, with per-tool overrides. A reference
step given without arguments matches any arguments.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from evaluators.agents.extract import ToolCall, read_history
from evaluators.normalize import EvaluationError, json_equal

Mode = Literal["strict", "unordered", "subset", "superset", "in_order"]
ArgumentsMode = Literal["exact", "subset", "ignore"]
PREVIEW = 120


@dataclass(frozen=True, slots=True)
class Expected:
    name: str
    arguments: Any = None  # None: any arguments


@dataclass
class Verdict:
    success: bool
    reason: str
    failed_step: int | None = None  # the agent's step (from 1) where the check failed
    reference_step: int | None = None  # the reference step (from 1) that was not met

    def outputs(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "failed_step": self.failed_step,
            "reference_step": self.reference_step,
            "reason": self.reason,
        }


# --- the reference ------------------------------------------------------------------------------


def reference_calls(value: Any, where: str) -> list[Expected]:
    """A reference trajectory: tool names, ``{name, arguments}`` objects (OpenAI's
    ``{function: {name, arguments}}`` too), a message history, or any of these as JSON text.
    ``where`` names it in errors: ``in column 'expected_trajectory'``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _bad_reference(f"{where} is text that is not JSON")
    if isinstance(value, dict):
        value = value.get("messages", value.get("tool_calls", value))
    if not isinstance(value, list):
        raise _bad_reference(f"{where} is {_kind_of(value)}, not a list of tool calls")
    if value and all(isinstance(item, dict) and "role" in item for item in value):
        try:
            calls = read_history(value, "messages").calls
        except EvaluationError as exc:
            problem = exc.message.removesuffix(".")
            raise _bad_reference(f"{where} is a malformed message history: {problem}")
        return [Expected(call.name, call.arguments) for call in calls]
    return [_expected(item, f"{where}, step {number}") for number, item in enumerate(value, 1)]


def _expected(item: Any, at: str) -> Expected:
    if isinstance(item, str) and item.strip():
        return Expected(item)
    if not isinstance(item, dict):
        raise _bad_reference(f"{at} is neither a tool name nor an object with a name")
    function = item.get("function") if isinstance(item.get("function"), dict) else item
    name = function.get("name", item.get("tool"))
    if not isinstance(name, str) or not name.strip():
        raise _bad_reference(f"{at} has no tool name (name, tool or function.name)")
    arguments = next(
        (function[key] for key in ("arguments", "args", "input") if key in function), None
    )
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise _bad_reference(f"{at} has arguments that are not valid JSON")
    return Expected(name, arguments)


def _bad_reference(problem: str) -> EvaluationError:
    return EvaluationError(f"The reference trajectory {problem}.", code="invalid_reference")


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null" if value is None else f"a {type(value).__name__}"


# --- comparing one call ---------------------------------------------------------------------------


class Matcher:
    """Decides whether a call meets a reference step, and says why not."""

    def __init__(self, arguments: ArgumentsMode, overrides: Mapping[str, ArgumentsMode]):
        self.arguments = arguments
        self.overrides = overrides

    def mode_for(self, name: str) -> ArgumentsMode:
        return self.overrides.get(name, self.arguments)

    def mismatch(self, call: ToolCall, expected: Expected) -> str | None:
        """None when the call meets the step, else what differs."""
        if call.name != expected.name:
            return f"{call.name} instead of {expected.name}"
        mode = self.mode_for(call.name)
        if mode == "ignore" or expected.arguments is None:
            return None
        found = _difference(call.arguments, expected.arguments, "", exact=mode == "exact")
        return f"{call.name} {found}" if found else None

    def same(self, call: ToolCall, expected: Expected) -> bool:
        return self.mismatch(call, expected) is None

    def describe(self, name: str, arguments: Any) -> str:
        if arguments is None or self.mode_for(name) == "ignore":
            return name
        return f"{name}({_short(arguments)})"


def _difference(actual: Any, expected: Any, path: str, *, exact: bool) -> str | None:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key, value in expected.items():
            at = f"{path}.{key}" if path else str(key)
            if key not in actual:
                return f"argument {at} is missing (expected {_short(value)})"
            found = _difference(actual[key], value, at, exact=exact)
            if found:
                return found
        extra = [key for key in actual if key not in expected] if exact else []
        if extra:
            at = f"{path}.{extra[0]}" if path else str(extra[0])
            return f"argument {at} is not in the reference"
        return None
    if json_equal(actual, expected):
        return None
    if not path:
        return f"arguments {_short(actual)} differ from {_short(expected)}"
    return f"argument {path} is {_short(actual)}, expected {_short(expected)}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


# --- whole trajectories ---------------------------------------------------------------------------


def match_trajectory(
    calls: Sequence[ToolCall], expected: Sequence[Expected], mode: Mode, matcher: Matcher
) -> Verdict:
    if mode == "strict":
        return _strict(calls, expected, matcher)
    if mode == "in_order":
        return _in_order(calls, expected, matcher)
    pairs = max_matching(calls, expected, matcher.same)
    if mode in ("unordered", "subset"):
        extra = next((i for i in range(len(calls)) if i not in pairs), None)
        if extra is not None:
            call = calls[extra]
            return Verdict(
                False,
                f"step {extra + 1}: {matcher.describe(call.name, call.arguments)} matches no "
                f"reference step",
                failed_step=extra + 1,
            )
    if mode in ("unordered", "superset"):
        used = set(pairs.values())
        missing = next((j for j in range(len(expected)) if j not in used), None)
        if missing is not None:
            return _never_called(missing, calls, expected, matcher)
    return Verdict(True, _success_reason(mode, len(calls), len(expected)))


def _strict(calls: Sequence[ToolCall], expected: Sequence[Expected], matcher: Matcher) -> Verdict:
    for index, (call, step) in enumerate(zip(calls, expected, strict=False)):
        problem = matcher.mismatch(call, step)
        if problem:
            return Verdict(
                False, f"step {index + 1}: {problem}", index + 1, reference_step=index + 1
            )
    if len(calls) > len(expected):
        extra = calls[len(expected)]
        return Verdict(
            False,
            f"step {len(expected) + 1}: {extra.name} is an extra call; the reference has "
            f"{len(expected)} steps",
            failed_step=len(expected) + 1,
        )
    if len(calls) < len(expected):
        step = expected[len(calls)]
        return Verdict(
            False,
            f"reference step {len(calls) + 1}: {matcher.describe(step.name, step.arguments)} was "
            f"never called; the agent made {len(calls)} calls",
            reference_step=len(calls) + 1,
        )
    return Verdict(True, _success_reason("strict", len(calls), len(expected)))


def _in_order(calls: Sequence[ToolCall], expected: Sequence[Expected], matcher: Matcher) -> Verdict:
    # Taking the earliest call that meets each step leaves the most calls for the later steps.
    position = 0
    for number, step in enumerate(expected, 1):
        while position < len(calls) and not matcher.same(calls[position], step):
            position += 1
        if position == len(calls):
            return _never_called(number - 1, calls, expected, matcher, in_order=True)
        position += 1
    return Verdict(True, _success_reason("in_order", len(calls), len(expected)))


def _never_called(
    index: int,
    calls: Sequence[ToolCall],
    expected: Sequence[Expected],
    matcher: Matcher,
    in_order: bool = False,
) -> Verdict:
    step = expected[index]
    reason = f"reference step {index + 1}: {matcher.describe(step.name, step.arguments)} was never "
    reason += "called"
    if in_order and index:
        reason += f" after reference step {index} ({expected[index - 1].name})"
    near = next((call for call in calls if call.name == step.name), None)
    problem = matcher.mismatch(near, step) if near is not None else None
    if problem:
        reason += f" ({problem})"
    return Verdict(False, reason, reference_step=index + 1)


def _success_reason(mode: str, calls: int, steps: int) -> str:
    return {
        "strict": f"the {calls} tool calls match the reference, in order",
        "unordered": f"the {calls} tool calls match the reference's {steps} steps",
        "subset": f"all {calls} tool calls are in the reference",
        "superset": f"all {steps} reference steps were called",
        "in_order": f"all {steps} reference steps were called, in order",
    }[mode]


def max_matching(
    calls: Sequence[ToolCall],
    expected: Sequence[Expected],
    same: Callable[[ToolCall, Expected], bool],
) -> dict[int, int]:
    """The most (call, reference step) pairs that meet, each used once: {call: step}.

    Greedy pairing can miss a pairing that exists (a step without arguments takes the only call
    another step could have had), so this augments paths (Kuhn's algorithm), without recursion.
    """
    edges = [[j for j, step in enumerate(expected) if same(call, step)] for call in calls]
    owner: dict[int, int] = {}  # step -> call
    for start in range(len(calls)):
        if edges[start]:
            _augment(start, edges, owner)
    return {call: step for step, call in owner.items()}


def _augment(start: int, edges: list[list[int]], owner: dict[int, int]) -> bool:
    seen: set[int] = set()
    stack = [(start, iter(edges[start]))]
    path: list[tuple[int, int]] = []
    while stack:
        call, options = stack[-1]
        for step in options:
            if step in seen:
                continue
            seen.add(step)
            path.append((call, step))
            if step not in owner:
                for taker, taken in path:
                    owner[taken] = taker
                return True
            stack.append((owner[step], iter(edges[owner[step]])))
            break
        else:
            stack.pop()
            if path:
                path.pop()
    return False


def f1_scores(
    calls: Sequence[ToolCall], expected: Sequence[Expected], matcher: Matcher
) -> dict[str, Any]:
    """Precision (share of calls the reference has), recall (share of reference steps called) and
    F1. An empty side counts as fully precise (no calls) or fully recalled (nothing expected)."""
    pairs = max_matching(calls, expected, matcher.same)
    matched = len(pairs)
    precision = matched / len(calls) if calls else 1.0
    recall = matched / len(expected) if expected else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    used = set(pairs.values())
    return {
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "matched": matched,
        "calls": len(calls),
        "expected": len(expected),
        "missing": [step.name for j, step in enumerate(expected) if j not in used],
        "unexpected": [call.name for i, call in enumerate(calls) if i not in pairs],
    }
