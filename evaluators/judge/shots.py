"""Few-shot examples of an LLM judge: cases already judged, sent as literal chat messages.

Each example (``few_shot`` in the judge's settings: ``{inputs, outputs, expected, note}``) becomes
a user message showing its inputs and output and an assistant message holding the answer the
judge should give, in the judge's own answer shape (``scores.answer_schema``). They go after the
system messages and before the templated messages. They are data, never templates: a trace that
contains ``{{ ... }}`` or ``{% ... %}`` reaches the model exactly as it was written.
"""

from __future__ import annotations

import json
from typing import Any

from evaluators.judge import scores

REASONING = "As reviewed."  # the answer's reasoning when an example carries no note


def answer(expected: Any, note: str, p) -> dict[str, Any]:
    """The judge's answer object for an example: ``expected`` under the score shape's key."""
    key = {"binary": "verdict", "numeric": "score", "categorical": "label"}.get(
        p.score_type, "criteria"
    )
    found: dict[str, Any] = {"reasoning": note or REASONING} if p.reasoning else {}
    found[key] = expected
    return found


def expected_problem(expected: Any, p) -> str | None:
    """Why ``expected`` is not an answer this judge could give (None when it is)."""
    try:
        scores.parse_object(json.dumps(answer(expected, "", p)), scores.answer_schema(p))
    except scores.BadAnswer as bad:
        return str(bad)
    return None


def shot_messages(p) -> list[dict[str, str]]:
    """Two messages per example, in order."""
    messages = []
    for shot in p.few_shot:
        lines = [
            "An example case, with the answer it should get.",
            "",
            "Inputs:",
            json.dumps(shot.inputs, ensure_ascii=False, indent=2, default=str),
            "",
            "Output:",
            _text(shot.outputs),
        ]
        if shot.note and not p.reasoning:
            lines += ["", f"Note: {shot.note}"]
        content = json.dumps(answer(shot.expected, shot.note, p), ensure_ascii=False)
        messages += [
            {"role": "user", "content": "\n".join(lines)},
            {"role": "assistant", "content": content},
        ]
    return messages


def with_shots(messages: list[dict], shots: list[dict]) -> list[dict]:
    """``shots`` inserted after the leading system messages."""
    if not shots:
        return messages
    lead = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    return [*messages[:lead], *shots, *messages[lead:]]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
