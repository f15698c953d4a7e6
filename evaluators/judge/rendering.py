"""Curly and jinja2 themselves: what a render worker runs (``render_worker``), nothing else.

Never called in a server process: ``templates.render_all`` and ``templates.syntax_problems`` send
the work to a render worker, whose limits bound what the guards below cannot (``render_pool``).
The guards stay because they turn the common mistakes into precise messages: ``range()`` is
capped at ``_MAX_ITERATIONS`` iterations per render, ``*`` may not build a string or list longer
than ``MAX_PROMPT_CHARS`` nor ``**`` raise to a power above 64, and the printed prompt may not
grow past ``MAX_PROMPT_CHARS``. ``MemoryError`` is never turned into a template message: it
reaches the worker, which reports the memory limit.

This module imports nothing of evalsite's, so a worker starts in a fraction of a second.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from typing import Any

import jinja2
import jsonpointer
from jinja2.sandbox import SandboxedEnvironment, SecurityError
from jsonpath_ng.ext import parse as jsonpath_parse

MAX_PROMPT_CHARS = 2_000_000
_VARIABLE = re.compile(r"(\\?)\{\{(.*?)\}\}", re.S)
_SEGMENT = re.compile(r"([^.\[\]]+)|\[(-?\d+)\]")


class _Missing(Exception):
    pass


def render_here(
    format: str, templates: list[str], variables: dict[str, Any]
) -> tuple[list[str], list[str], list[str]]:
    """The rendered texts, the unresolved names and the template errors, in this process."""
    renderer = _render_curly if format == "curly" else _render_jinja
    rendered, missing, invalid = [], [], []
    for template in templates:
        text, template_missing, template_invalid = renderer(template, variables)
        rendered.append(text)
        missing += template_missing
        invalid += template_invalid
    return rendered, missing, invalid


def syntax_here(format: str, templates: list[str]) -> list[str]:
    problems = []
    for template in templates:
        if format == "jinja2":
            try:
                _compiled(template)
            except jinja2.TemplateSyntaxError as exc:
                problems.append(f"jinja2 syntax error on line {exc.lineno}: {exc.message}")
            continue
        for match in _VARIABLE.finditer(template):
            expression = match.group(2).strip()
            if not match.group(1) and expression.startswith("$"):
                try:
                    _jsonpath(expression)
                except ValueError as exc:
                    problems.append(f"{{{{{expression}}}}}: {exc}")
    return problems


def to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


# --- curly ------------------------------------------------------------------------------------


def _render_curly(template: str, variables: dict) -> tuple[str, list[str], list[str]]:
    missing: list[str] = []
    invalid: list[str] = []

    def substitute(match: re.Match) -> str:
        if match.group(1):
            return "{{" + match.group(2) + "}}"
        expression = match.group(2).strip()
        try:
            return to_text(resolve(expression, variables))
        except _Missing:
            missing.append(expression or "(empty)")
        except ValueError as exc:
            invalid.append(f"{{{{{expression}}}}}: {exc}")
        return match.group(0)

    return _VARIABLE.sub(substitute, template), missing, invalid


def resolve(expression: str, variables: dict) -> Any:
    """The value of one curly reference; raises ``_Missing``, or ``ValueError`` when the
    expression itself is malformed."""
    if expression.startswith("$"):
        try:
            matches = [m.value for m in _jsonpath(expression).find(variables)]
        except MemoryError:
            raise  # the worker's memory limit, not a malformed path
        except Exception as exc:  # a filter comparing what cannot be compared, ...
            raise ValueError(f"the JSONPath failed ({type(exc).__name__}: {exc})")
        if not matches:
            raise _Missing
        return matches[0] if len(matches) == 1 else matches
    if expression.startswith("/"):
        try:
            return jsonpointer.resolve_pointer(variables, expression)
        except jsonpointer.JsonPointerException:
            raise _Missing
    return _dot_path(expression, variables)


@functools.lru_cache(maxsize=512)
def _jsonpath(expression: str):
    try:
        return jsonpath_parse(expression)
    except Exception as exc:  # the lexer and parser raise their own types and bare Exception
        raise ValueError(f"not a valid JSONPath ({exc})")


def _dot_path(expression: str, variables: dict) -> Any:
    if not expression:
        raise _Missing
    value: Any = variables
    for name, index in _segments(expression):
        if isinstance(value, dict) and name is not None and name in value:
            value = value[name]
        elif isinstance(value, list) and (
            index is not None or (name or "").lstrip("-").isdecimal()
        ):
            position = int(index if index is not None else name)
            if not -len(value) <= position < len(value):
                raise _Missing
            value = value[position]
        else:
            raise _Missing
    return value


def _segments(expression: str) -> list[tuple[str | None, str | None]]:
    parts = []
    for part in expression.split("."):
        found = _SEGMENT.findall(part)
        if not found or "".join(n or f"[{i}]" for n, i in found) != part:
            return [(expression, None)]  # not a path: look the whole text up as a name
        parts += [(n or None, i or None) for n, i in found]
    return parts


# --- jinja2 -----------------------------------------------------------------------------------

_MAX_ITERATIONS = 1_000_000
_local = threading.local()


class _Recorded(jinja2.ChainableUndefined):
    """Undefined that may be tested for truth but records itself when printed or looped over."""

    def _record(self) -> None:
        getattr(_local, "missing", []).append(self._undefined_name or "(undefined)")

    def __str__(self) -> str:
        self._record()
        return ""

    def __iter__(self):
        self._record()
        return iter(())


class _Environment(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int | float) and abs(right) > 64:
            raise SecurityError("exponent too large")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                sized = isinstance(seq, str | list | tuple) and isinstance(times, int)
                if sized and len(seq) * times > MAX_PROMPT_CHARS:
                    raise SecurityError("repetition too large")
        return super().call_binop(context, operator, left, right)


def _finalize(value: Any) -> Any:
    if isinstance(value, dict | list | bool) or value is None:
        return json.dumps(value, ensure_ascii=False, default=str)
    return value


def _tojson(value: Any, indent: int | None = None) -> str:
    if isinstance(value, jinja2.Undefined):
        str(value)
        return ""
    return json.dumps(value, ensure_ascii=False, indent=indent, default=str)


def _range(*args: int):
    _local.iterations = getattr(_local, "iterations", 0) + len(range(*args))
    if _local.iterations > _MAX_ITERATIONS:
        raise SecurityError(f"more than {_MAX_ITERATIONS} loop iterations over range()")
    return range(*args)


@functools.cache
def _environment() -> _Environment:
    env = _Environment(
        undefined=_Recorded, autoescape=False, keep_trailing_newline=True, finalize=_finalize
    )
    env.filters["tojson"] = _tojson
    env.globals["range"] = _range
    return env


@functools.lru_cache(maxsize=256)
def _compiled(template: str) -> jinja2.Template:
    return _environment().from_string(template)


def _render_jinja(template: str, variables: dict) -> tuple[str, list[str], list[str]]:
    _local.missing, _local.iterations = [], 0
    try:
        compiled = _compiled(template)
        parts, size = [], 0
        for chunk in compiled.generate(**variables):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise SecurityError(f"the prompt grew past {MAX_PROMPT_CHARS} characters")
            parts.append(chunk)
    except jinja2.TemplateSyntaxError as exc:
        return template, [], [f"jinja2 syntax error on line {exc.lineno}: {exc.message}"]
    except SecurityError as exc:
        return template, [], [f"jinja2 refused: {exc}"]
    except MemoryError:
        raise  # the worker's memory limit, not an error of the template's logic
    except Exception as exc:  # errors inside the template (a bad filter call, 1/0, ...)
        return template, [], [f"jinja2: {type(exc).__name__}: {exc}"]
    return "".join(parts), list(_local.missing), []
