"""Prompt templates: ``curly`` (the default) and ``jinja2`` (sandboxed).

``curly`` replaces each ``{{ reference }}`` with a value from the template variables
(``evaluators.judge.context.template_variables``). A reference is one of:

- a name with dot paths and list indices: ``{{country}}``, ``{{inputs.country}}``,
  ``{{inputs.messages[0].content}}`` (``inputs.messages.0.content`` works too);
- a JSONPath when it starts with ``$``: ``{{$.inputs.country}}``, ``{{$.inputs.tags[*]}}``
  (several matches render as a JSON list);
- a JSON Pointer when it starts with ``/``: ``{{/inputs/country}}``.

Strings render as they are; everything else (objects, lists, numbers, booleans, null) as JSON,
so ``{{inputs}}`` is the whole row as JSON. ``\\{{`` writes a literal ``{{``. A reference with no
value is an error that lists every unresolved reference of the whole prompt at once.

``jinja2`` renders with ``jinja2.sandbox.SandboxedEnvironment`` over the same variables (no
autoescaping; objects and lists print as JSON; ``tojson`` does not escape for HTML). An undefined
name may be tested (``{% if reference %}``) but printing or looping over it is an error that lists
every such name. Ranges, repetition and output size are bounded.

Both formats render in a render worker process (``render_pool``), never in the calling process,
so a template is bounded in time and memory whatever it does: it gets
``EVALSITE_TEMPLATE_RENDER_SECONDS`` of wall clock and ``EVALSITE_TEMPLATE_RENDER_MEMORY_MB`` for
everything it builds, printed or not, and overrunning either is ``template_error`` ("the template
did not finish within 2 s", "the template needed more than 256 MB"). ``render_all`` is one round
trip to a worker whatever the number of templates; ``syntax_problems`` is one too, since parsing
a template is work as well. The languages themselves are in ``rendering``.
"""

from __future__ import annotations

import re
from typing import Any

from evaluators.judge import render_pool
from evaluators.judge.sessions import SESSION_VARIABLES
from evaluators.normalize import EvaluationError

_ROOT_NAME = re.compile(r"^[$/.]*([A-Za-z_][A-Za-z0-9_]*)")


def render(template: str, variables: dict[str, Any], *, format: str = "curly") -> str:
    """Render one template; raises ``EvaluationError`` (``unresolved_variables`` or
    ``template_error``). Use :func:`render_all` to report every message's problems at once."""
    return render_all([template], variables, format=format)[0]


def render_all(
    templates: list[str], variables: dict[str, Any], *, format: str = "curly"
) -> list[str]:
    rendered, missing, invalid = render_pool.call(("render", format, templates, variables))
    if invalid:
        raise EvaluationError("; ".join(dict.fromkeys(invalid)), code="template_error")
    if missing:
        raise unresolved(list(dict.fromkeys(missing)), variables)
    return rendered


def syntax_problems(templates: list[str], *, format: str = "curly") -> list[str]:
    """What is malformed in the templates themselves, whatever the variables (for save time)."""
    try:
        return render_pool.call(("syntax", format, templates))
    except EvaluationError as exc:  # a template too costly to parse is a problem too
        return [exc.message]


def unresolved(names: list[str], variables: dict[str, Any]) -> EvaluationError:
    available = ", ".join(sorted(k for k in variables if isinstance(k, str)))
    hint = ""
    if any(n.split(".")[0] in ("reference", "correct_answer", "ground_truth") for n in names):
        hint = (
            " The ground-truth names exist only when the testcase has the column named by "
            "correct_answer_key."
        )
    if "session" not in variables and any(_root(n) in SESSION_VARIABLES for n in names):
        hint += (
            " The session names (session, session_transcript, session_outline) exist only when "
            "the judge evaluates a whole session (a session rule, or invoke with a session); a "
            "trace evaluation has trace and trace_outline."
        )
    return EvaluationError(
        f"The prompt uses {len(names)} unresolved variable{'s' if len(names) > 1 else ''}: "
        f"{', '.join(names)}. Available: {available}.{hint}",
        code="unresolved_variables",
    )


def _root(name: str) -> str:
    """The variable a reference starts from: ``session`` for ``$.session.messages``."""
    found = _ROOT_NAME.match(name.strip())
    return found.group(1) if found else ""
