"""Script prompt templates: a Python, JavaScript or TypeScript script writes the prompt.

The script runs in the code sandbox (``evaluators.sandbox.script``: no network, no host files, an
empty environment, so no model key), reads the evaluation context as JSON on stdin
(``evaluators.judge.context.evaluation_context``, snake_case) and prints the prompt on stdout.
One trailing newline is dropped (``print`` and ``console.log`` add one); an empty stdout is the
empty prompt. A non-zero exit is an error carrying the exit code and the end of stderr.

Helpers, importable or used as globals without an import:

- Python: ``from evalsite_eval import define_prompt_template`` then decorate a function of the
  context (a dict that also allows ``ctx.question``), sync or ``async``, returning a string.
- JavaScript / TypeScript: ``import { definePromptTemplate } from "@evalsite/eval"`` (also
  ``require``), ``definePromptTemplate((ctx) => ...)``, sync or async, where ``ctx`` has the
  camelCase names (``ctx.candidateAnswer``). ``@agentv/eval`` is an alias.
"""

from __future__ import annotations

import json

from evaluators.judge.context import evaluation_context
from evaluators.normalize import EvaluationError
from evaluators.sandbox import SandboxUnavailable
from evaluators.sandbox.script import run_script

PYTHON_HELPER = '''
"""evalsite_eval: helpers for prompt-template scripts."""
import asyncio
import inspect
import json
import sys


class PromptTemplateInput(dict):
    """The evaluation context: ctx["question"] or ctx.question."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def read_context():
    text = sys.stdin.read()
    return PromptTemplateInput(json.loads(text) if text.strip() else {})


async def _settle(value):
    return await value


def define_prompt_template(fn):
    """Call fn with the context and print the prompt it returns (awaited when async)."""
    prompt = fn(read_context())
    if inspect.isawaitable(prompt):
        prompt = asyncio.run(_settle(prompt))
    if not isinstance(prompt, str):
        raise TypeError(
            f"the prompt template returned {type(prompt).__name__}; it must return a string"
        )
    sys.stdout.write(prompt)
    sys.stdout.flush()
    return fn
'''

JAVASCRIPT_HELPER = r"""
'use strict';
const fs = require('fs');

function camel(key) {
  return key.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
}

function readContext() {
  let text = '';
  try {
    text = fs.readFileSync(0, 'utf8');
  } catch (error) {
    if (error.code !== 'EOF') throw error;
  }
  const raw = text.trim() ? JSON.parse(text) : {};
  const context = {};
  for (const [key, value] of Object.entries(raw)) context[camel(key)] = value;
  return context;
}

function writeOut(text) {
  const buffer = Buffer.from(text, 'utf8');
  let offset = 0;
  while (offset < buffer.length) {
    try {
      offset += fs.writeSync(1, buffer, offset);
    } catch (error) {
      if (error.code !== 'EAGAIN') throw error;
    }
  }
}

function definePromptTemplate(fn) {
  const context = readContext();
  Promise.resolve()
    .then(() => fn(context))
    .then((prompt) => {
      if (typeof prompt !== 'string') {
        const what = prompt === null ? 'null' : typeof prompt;
        throw new TypeError(`the prompt template returned ${what}; it must return a string`);
      }
      writeOut(prompt);
    })
    .catch((error) => {
      fs.writeSync(2, String((error && error.stack) || error) + '\n');
      process.exitCode = 1;
    });
  return fn;
}

module.exports = { definePromptTemplate, readContext };
"""

_MODULES = {
    "python": {"evalsite_eval": PYTHON_HELPER},
    "javascript": {"@evalsite/eval": JAVASCRIPT_HELPER, "@agentv/eval": JAVASCRIPT_HELPER},
}
_PRELOAD = {
    "python": [("evalsite_eval", "define_prompt_template")],
    "javascript": [("@evalsite/eval", "definePromptTemplate")],
}
STDERR_LINES = 20


def script_prompt(parameters, inputs: dict, outputs, trace, session: dict | None = None) -> str:
    """Run the judge's prompt script for one evaluation; its stdout is the prompt. The context
    has ``session``, ``session_transcript`` and ``session_outline`` (``sessionTranscript`` ...
    in JavaScript), null unless a session is judged."""
    context = evaluation_context(
        inputs=inputs,
        outputs=outputs,
        trace=trace,
        correct_answer_key=parameters.correct_answer_key,
        config=parameters.config,
        session=session,
    )
    family = "python" if parameters.script_runtime == "python" else "javascript"
    try:
        result = run_script(
            runtime=parameters.script_runtime,
            code=parameters.script,
            stdin=json.dumps(context, ensure_ascii=False, default=str),
            timeout_s=parameters.script_timeout_s,
            modules=_MODULES[family],
            preload=_PRELOAD[family],
            filename={"python": "prompt.py", "javascript": "prompt.js", "typescript": "prompt.ts"}[
                parameters.script_runtime
            ],
        )
    except SandboxUnavailable as exc:
        raise EvaluationError(f"The code sandbox is unavailable: {exc}", code="sandbox_unavailable")
    if result.fault:
        raise EvaluationError(
            f"The prompt script failed: {result.message}{_tail(result.stderr)}",
            code=f"script_{result.fault}",
            stacktrace=result.stderr,
        )
    if result.exit_code != 0:
        raise EvaluationError(
            f"The prompt script exited with status {result.exit_code}.{_tail(result.stderr)}",
            code="script_failed",
            type="ScriptError",
            stacktrace=result.stderr,
        )
    prompt = result.stdout
    return prompt.removesuffix("\n").removesuffix("\r") if prompt.endswith("\n") else prompt


def _tail(stderr: str) -> str:
    lines = stderr.strip().splitlines()[-STDERR_LINES:]
    return (" stderr:\n" + "\n".join(lines)) if lines else " (nothing on stderr)"
