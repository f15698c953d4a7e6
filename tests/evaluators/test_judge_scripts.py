"""Script prompt templates in the real sandbox: three runtimes, sync and async, failing, empty,
and a model key that sandboxed code never sees."""

import json
import textwrap

import pytest

from evaluators.models import ModelConnection
from evaluators.services import evaluation_invoke
from tests.llm_server import MODEL_API_KEY

INPUTS = {"question": "Capital of France?", "correct_answer": "Paris", "country": "France"}

PYTHON_SYNC = """
from evalsite_eval import define_prompt_template

@define_prompt_template
def prompt(ctx):
    return f"Q: {ctx.question}\\nA: {ctx.candidate_answer}\\nRef: {ctx['reference_answer']}"
"""
PYTHON_ASYNC = """
import asyncio

@define_prompt_template  # a global too, no import needed
async def prompt(ctx):
    await asyncio.sleep(0.01)
    return f"Q: {ctx.question}\\nA: {ctx.candidate_answer}\\nRef: {ctx.reference_answer}"
"""
JAVASCRIPT_SYNC = """
const { definePromptTemplate } = require('@evalsite/eval');
definePromptTemplate((ctx) => `Q: ${ctx.question}\\nA: ${ctx.candidateAnswer}\\nRef: ${ctx.referenceAnswer}`);
"""
JAVASCRIPT_ASYNC = """
export default definePromptTemplate(async (ctx) => {
  await new Promise((resolve) => setTimeout(resolve, 10));
  return `Q: ${ctx.question}\\nA: ${ctx.candidateAnswer}\\nRef: ${ctx.referenceAnswer}`;
});
"""
TYPESCRIPT_SYNC = """
import { definePromptTemplate } from '@evalsite/eval';

interface Ctx { question: string; candidateAnswer: string; referenceAnswer: string | null }

export default definePromptTemplate((ctx: Ctx): string =>
  `Q: ${ctx.question}\\nA: ${ctx.candidateAnswer}\\nRef: ${ctx.referenceAnswer}`);
"""
TYPESCRIPT_ASYNC = """
import { definePromptTemplate } from '@agentv/eval';

const later = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

export default definePromptTemplate(async (ctx: Record<string, unknown>): Promise<string> => {
  await later(10);
  return `Q: ${ctx.question}\\nA: ${ctx.candidateAnswer}\\nRef: ${ctx.referenceAnswer}`;
});
"""
EXPECTED = "Q: Capital of France?\nA: Paris\nRef: Paris"


def judge(project, runtime, script, inputs=None, outputs="Paris", **parameters):
    return evaluation_invoke(
        kind="llm_judge",
        parameters={
            "connection": "local",
            "prompt_source": "script",
            "script_runtime": runtime,
            "script": textwrap.dedent(script),
            "format_instructions": False,
            **parameters,
        },
        inputs=INPUTS if inputs is None else inputs,
        outputs=outputs,
        project=project,
    )


def sent_prompt(llm_server) -> str:
    [call] = llm_server.calls
    messages = call.json()["messages"]
    assert [m["role"] for m in messages] == ["user"]
    return messages[0]["content"]


@pytest.mark.parametrize(
    ("runtime", "script"),
    [
        ("python", PYTHON_SYNC),
        ("python", PYTHON_ASYNC),
        ("javascript", JAVASCRIPT_SYNC),
        ("javascript", JAVASCRIPT_ASYNC),
        ("typescript", TYPESCRIPT_SYNC),
        ("typescript", TYPESCRIPT_ASYNC),
    ],
    ids=["python", "python-async", "js", "js-async", "ts", "ts-async"],
)
def test_the_helper_writes_the_prompt(project, llm_connection, llm_server, runtime, script):
    result = judge(project, runtime, script)
    assert result.status == "success", result.error
    assert sent_prompt(llm_server) == EXPECTED
    assert result.details["rendered_prompt"] == [{"role": "user", "content": EXPECTED}]


@pytest.mark.parametrize(
    ("runtime", "script"),
    [
        ("python", "import json, sys\nctx = json.load(sys.stdin)\nprint('Q:', ctx['question'])\n"),
        (
            "javascript",
            "const ctx = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n"
            "console.log('Q: ' + ctx.question);\n",
        ),
        (
            "typescript",
            "import * as fs from 'fs';\nconst ctx: any = JSON.parse(fs.readFileSync(0, 'utf8'));\n"
            "process.stdout.write(`Q: ${ctx.question}\\n`);\n",
        ),
    ],
)
def test_a_plain_script_reads_stdin_and_prints(
    project, llm_connection, llm_server, runtime, script
):
    result = judge(project, runtime, script)
    assert result.status == "success", result.error
    assert sent_prompt(llm_server) == "Q: Capital of France?"  # one trailing newline dropped


@pytest.mark.parametrize(
    ("runtime", "script"),
    [
        ("python", "import json, sys\nprint(json.dumps(sorted(json.load(sys.stdin))))"),
        (
            "javascript",
            "definePromptTemplate((ctx) => JSON.stringify(Object.keys(ctx).sort()));",
        ),
    ],
)
def test_the_context_has_every_field(project, llm_connection, llm_server, runtime, script):
    judge(project, runtime, script)
    fields = set(json.loads(sent_prompt(llm_server)))
    snake = {
        "question",
        "candidate_answer",
        "reference_answer",
        "expected_outcome",
        "expected_messages",
        "output_messages",
        "guideline_files",
        "input_files",
        "input_messages",
        "trace_summary",
        "config",
    }
    if runtime == "python":
        assert fields >= snake
    else:
        camel = {
            "".join(w.capitalize() if i else w for i, w in enumerate(f.split("_"))) for f in snake
        }
        assert fields >= camel
        assert "candidateAnswer" in fields and "traceSummary" in fields


def test_config_reaches_the_script(project, llm_connection, llm_server):
    script = "definePromptTemplate((ctx) => `strict=${ctx.config.strict}`);"
    judge(project, "javascript", script, config={"strict": True})
    assert sent_prompt(llm_server) == "strict=true"


@pytest.mark.parametrize(
    ("runtime", "script", "status", "stderr"),
    [
        ("python", "raise ValueError('no prompt today')", 1, "ValueError: no prompt today"),
        ("python", "import sys\nsys.stderr.write('bad input\\n')\nsys.exit(3)", 3, "bad input"),
        (
            "python",
            "@define_prompt_template\nasync def p(ctx):\n    raise KeyError('gone')\n",
            1,
            "KeyError: 'gone'",
        ),
        ("javascript", "throw new Error('no prompt today');", 1, "Error: no prompt today"),
        (
            "javascript",
            "definePromptTemplate(async () => { throw new TypeError('async boom'); });",
            1,
            "TypeError: async boom",
        ),
        ("typescript", "const x: number = ;", 1, "SyntaxError"),
        ("python", "define_prompt_template(lambda ctx: 42)", 1, "must return a string"),
        ("javascript", "process.exit(7);", 7, ""),
    ],
)
def test_a_failing_script_is_an_error_with_its_stderr(
    project, llm_connection, llm_server, runtime, script, status, stderr
):
    result = judge(project, runtime, script)
    assert result.status == "error"
    assert result.error["code"] == "script_failed"
    assert f"exited with status {status}" in result.error["message"]
    assert stderr in result.error["message"]
    assert llm_server.calls == []
    assert result.outputs is None


def test_a_script_that_runs_too_long_is_stopped(project, llm_connection, llm_server):
    result = judge(project, "python", "while True:\n    pass\n", script_timeout_s=1)
    assert result.error["code"] == "script_timeout"
    assert llm_server.calls == []


@pytest.mark.parametrize(
    ("runtime", "script"),
    [
        ("python", "pass"),
        ("python", "define_prompt_template(lambda ctx: '')"),
        ("javascript", "definePromptTemplate(async () => '');"),
        ("typescript", "const nothing: string = '';"),
    ],
)
def test_empty_stdout_is_the_empty_prompt(project, llm_connection, llm_server, runtime, script):
    result = judge(project, runtime, script)
    assert result.status == "success", result.error
    assert sent_prompt(llm_server) == ""


def test_format_instructions_join_a_script_prompt(project, llm_connection, llm_server):
    judge(project, "python", "print('grade it')", format_instructions=True)
    system, user = llm_server.calls[0].json()["messages"]
    assert system["role"] == "system" and "JSON Schema of the answer" in system["content"]
    assert user == {"role": "user", "content": "grade it"}


# --- the key never reaches sandboxed code -------------------------------------------------------

SNOOP_PYTHON = """
import json, os, sys
found = {"env": dict(os.environ), "argv": sys.argv, "stdin": sys.stdin.read()}
for path in ("/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline"):
    try:
        found[path] = open(path, "rb").read().decode("latin-1")
    except OSError as exc:
        found[path] = repr(exc)
listing = []
for root, dirs, files in os.walk("/"):
    if root.startswith("/proc"):
        dirs[:] = []
        continue
    listing += [os.path.join(root, f) for f in files]
found["files"] = listing
for path in ("/work/main/.env", "/etc/passwd", "/root/.bash_history"):
    try:
        found[path] = open(path).read()
    except OSError as exc:
        found[path] = repr(exc)
print(json.dumps(found))
"""
SNOOP_JAVASCRIPT = """
const fs = require('fs');
const found = { env: process.env, argv: process.argv, stdin: fs.readFileSync(0, 'utf8') };
for (const path of ['/proc/self/environ', '/proc/1/environ', '/proc/1/cmdline', '/etc/passwd']) {
  try { found[path] = fs.readFileSync(path, 'latin1'); } catch (error) { found[path] = String(error); }
}
function walk(dir, out) {
  if (dir === '/proc') return out;
  let entries = [];
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch (error) { return out; }
  for (const entry of entries) {
    const path = (dir === '/' ? '' : dir) + '/' + entry.name;
    if (entry.isDirectory()) walk(path, out); else out.push(path);
  }
  return out;
}
found.files = walk('/', []);
console.log(JSON.stringify(found));
"""


@pytest.mark.parametrize(
    ("runtime", "script"), [("python", SNOOP_PYTHON), ("javascript", SNOOP_JAVASCRIPT)]
)
def test_a_script_never_sees_the_model_key(
    project, llm_connection, llm_server, settings, runtime, script
):
    result = judge(project, runtime, script)
    assert result.status == "success", result.error
    prompt = sent_prompt(llm_server)
    found = json.loads(prompt)
    assert found["files"]  # it did look around
    stored = ModelConnection.objects.get(pk=llm_connection.pk).api_key_encrypted
    for secret in (MODEL_API_KEY, stored, settings.SECRET_KEY, "DATABASE_URL", "REDIS_URL"):
        assert secret not in prompt
    assert set(found["env"]) <= {"LANG", "TZ", "PWD", "SHLVL", "_"}
    assert not any(
        path.endswith((".py", ".sqlite3")) and "/work/" in path for path in found["files"]
    )
