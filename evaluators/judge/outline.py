"""``{{trace_outline}}``: a trace as a compact, indented span tree that fits a token budget.

A judge that must read a whole agent run rarely needs every byte of it: the outline gives each
span one line (its kind, name, duration, status, tokens), with a tool's arguments and a span's
inputs and outputs cut short, children indented under their parent, and errors always named.
It fits ``budget`` tokens (characters / 4, the rule the run estimate uses): first by cutting the
inputs and outputs shorter, then by dropping them, then by eliding the spans that do not fit,
keeping every error span and saying how many were left out. The full tree stays in the drill-in.
"""

from __future__ import annotations

import json
from typing import Any

from evalsite.jsonpaths import dig

DEFAULT_TOKENS = 2000
MIN_TOKENS = 100
MAX_TOKENS = 50_000
CHARS_PER_TOKEN = 4
DETAIL_STEPS = (300, 120, 40, 0)  # characters of inputs / outputs shown per span, tried in turn
INDENT = "  "


def outline_budget(config: dict[str, Any] | None) -> int:
    """The judge's ``config.outline_tokens`` (clamped to 100..50,000), else 2,000."""
    value = (config or {}).get("outline_tokens", DEFAULT_TOKENS)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return DEFAULT_TOKENS
    return int(min(max(value, MIN_TOKENS), MAX_TOKENS))


def trace_outline(trace: dict[str, Any] | None, budget: int = DEFAULT_TOKENS) -> str | None:
    """The outline of a contract-shaped trace (``{"spans": {id: span}}``), or None without one."""
    if not isinstance(trace, dict) or not isinstance(trace.get("spans"), dict):
        return None
    nodes = list(_flatten(trace["spans"], 0))
    if not nodes:
        return None
    limit = budget * CHARS_PER_TOKEN
    for detail in DETAIL_STEPS:
        lines = [_line(span, depth, detail) for span, depth in nodes]
        text = "\n".join(lines)
        if len(text) <= limit:
            return text
    return _elided(nodes, limit)


def _flatten(spans: Any, depth: int):
    """(span, depth) in tree order, children by start time; anything but span objects skipped."""
    if not isinstance(spans, dict):
        return
    children = [s for s in spans.values() if isinstance(s, dict)]
    children.sort(key=lambda s: str(s.get("start_time") or ""))
    for span in children:
        yield span, depth
        yield from _flatten(span.get("children"), depth + 1)


def _line(span: dict[str, Any], depth: int, detail: int) -> str:
    kind = span.get("kind") or "span"
    parts = [f"{INDENT * depth}- [{kind}] {span.get('name') or '?'}"]
    metrics = dig(span, "attributes.ag.metrics.unit") or {}
    duration = dig(metrics, "duration.total")
    if isinstance(duration, int | float):
        parts.append(f"{duration:.0f} ms")
    status = str(span.get("status") or "ok")
    if status != "ok":
        message = str(span.get("status_message") or "")[:200]
        parts.append(f"{status.upper()}{': ' + message if message else ''}")
    tokens = dig(metrics, "tokens.total")
    if isinstance(tokens, int | float) and tokens:
        parts.append(f"{tokens:.0f} tokens")
    line = " · ".join(parts)
    if detail:
        data = dig(span, "attributes.ag.data") or {}
        for label, key in (("in", "inputs"), ("out", "outputs")):
            value = data.get(key) if isinstance(data, dict) else None
            if value not in (None, "", {}, []):
                line += f"\n{INDENT * (depth + 1)}{label}: {_short(value, detail)}"
    return line


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _elided(nodes: list[tuple[dict, int]], limit: int) -> str:
    """Lines without inputs and outputs, in tree order, as many as fit; the error spans that did
    not fit are kept after them, and a last line says what was left out."""
    lines = [_line(span, depth, 0) for span, depth in nodes]
    errors = [i for i, (span, _) in enumerate(nodes) if (span.get("status") or "ok") != "ok"]
    reserve = sum(len(lines[i]) + 1 for i in errors[:20]) + 80
    kept: list[int] = []
    used = 0
    for i, line in enumerate(lines):
        if used + len(line) + 1 > max(limit - reserve, 0):
            break
        kept.append(i)
        used += len(line) + 1
    shown = set(kept)
    late_errors = [i for i in errors if i not in shown][:20]
    out = [lines[i] for i in kept]
    if late_errors:
        out.append("… errors further on:")
        out += [lines[i].strip() for i in late_errors]
    left = len(lines) - len(kept) - len(late_errors)
    if left:
        out.append(f"… {left} more span(s) not shown (outline budget); the drill-in has them all")
    text = "\n".join(out)
    return text[:limit]
