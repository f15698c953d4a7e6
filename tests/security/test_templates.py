"""Template boundary: a curly or jinja2 judge prompt renders in a render worker process, so a
template that loops for ever or builds a huge value it never prints gets a ``template_error``
naming the limit, and the process that asked keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evaluators.judge import render_pool
from evaluators.judge.templates import render, render_all, syntax_problems
from evaluators.normalize import EvaluationError

ROOT = Path(__file__).resolve().parents[2]
LONG_LOOP = '{% for a in "x" * 100000 %}{% for b in "x" * 100000 %}{% endfor %}{% endfor %}'
LONG_LOOP_OVER_A_VARIABLE = "{% for a in s %}{% for b in s %}{{ '' }}{% endfor %}{% endfor %}"
BUILT_NOT_PRINTED = [
    '{% if ("x"|center(300000000)) %}built{% endif %}',
    '{% set padded = "%0300000000d"|format(1) %}built',
    '{% set joined = ["x" * 1000000] * 300 %}{% if joined|join %}built{% endif %}',
]


@pytest.fixture
def one_second(settings):
    settings.EVALSITE_TEMPLATE_RENDER_SECONDS = 1
    return settings


def refusal(template: str, variables: dict | None = None, fmt: str = "jinja2") -> EvaluationError:
    with pytest.raises(EvaluationError) as caught:
        render(template, variables or {}, format=fmt)
    assert caught.value.code == "template_error"
    return caught.value


def assert_still_renders() -> None:
    assert render("Hello {{ name }}", {"name": "Ada"}, format="jinja2") == "Hello Ada"
    assert render("Hello {{name}}", {"name": "Ada"}) == "Hello Ada"


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent has not looked yet


# --- time ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "variables"),
    [(LONG_LOOP, {}), (LONG_LOOP_OVER_A_VARIABLE, {"s": "y" * 100_000})],
    ids=["literal", "variable"],
)
def test_it_stops_a_loop_over_a_long_string_at_the_deadline(one_second, template, variables):
    started = time.monotonic()
    error = refusal(template, variables)
    assert error.message == "the template did not finish within 1 s"
    assert time.monotonic() - started < 30  # bounded: the worker was killed, not waited for
    assert_still_renders()


def test_it_replaces_the_worker_it_killed(one_second):
    render("warm", {})
    before = set(render_pool.worker_pids())
    refusal(LONG_LOOP)
    killed = before - set(render_pool.worker_pids())
    assert len(killed) == 1
    assert not any(running(pid) for pid in killed)
    assert_still_renders()


# --- memory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("template", BUILT_NOT_PRINTED, ids=["center", "format", "join"])
def test_it_refuses_a_huge_value_built_and_never_printed(template):
    error = refusal(template)
    assert error.message == "the template needed more than 256 MB"
    assert_still_renders()


def test_the_memory_limit_is_a_setting(settings):
    settings.EVALSITE_TEMPLATE_RENDER_MEMORY_MB = 64
    error = refusal('{% if ("x"|center(100000000)) %}built{% endif %}')
    assert error.message == "the template needed more than 64 MB"
    settings.EVALSITE_TEMPLATE_RENDER_MEMORY_MB = 256
    assert render('{{ ("x"|center(100000000))|length }}', {}, format="jinja2") == "100000000"


def test_a_curly_template_is_bounded_too():
    error = refusal("{{big}}" * 2000, {"big": "z" * 200_000}, fmt="curly")
    assert error.message == "the template needed more than 256 MB"
    assert_still_renders()


# --- what did not change ------------------------------------------------------------------------


def test_it_renders_curly_and_jinja_as_before():
    variables = {"inputs": {"country": "France", "tags": ["a", "b"]}, "country": "France"}
    assert render_all(
        ["{{inputs.country}} {{$.inputs.tags[*]}} {{/inputs/tags/0}}", "\\{{x}}"], variables
    ) == ['France ["a", "b"] a', "{{x}}"]
    assert render_all(
        ["{% for t in inputs.tags %}{{ t|upper }}{% endfor %} {{ inputs }}"],
        variables,
        format="jinja2",
    ) == ['AB {"country": "France", "tags": ["a", "b"]}']


def test_the_guards_inside_the_worker_still_name_their_limit():
    assert (
        "more than 1000000 loop iterations"
        in refusal("{% for i in range(2000000) %}{% endfor %}").message
    )
    assert "repetition too large" in refusal('{{ "x" * 3000000 }}').message
    with pytest.raises(EvaluationError) as caught:
        render("{{ missing }}", {}, format="jinja2")
    assert caught.value.code == "unresolved_variables"


def test_syntax_problems_are_checked_in_a_worker_and_never_raise(one_second):
    assert syntax_problems(["{% if %}"], format="jinja2") == [
        "jinja2 syntax error on line 1: Expected an expression, got 'end of statement block'"
    ]
    assert syntax_problems(["{{ a }}", "{{$.x}}"]) == []


def test_many_threads_render_at_once_and_each_gets_its_own_answer(settings):
    settings.EVALSITE_TEMPLATE_RENDER_WORKERS = 2
    wrong: list[str] = []

    def renders(thread: int) -> None:
        for i in range(40):
            text = render("{{ t }}-{{ i }}", {"t": thread, "i": i}, format="jinja2")
            if text != f"{thread}-{i}":
                wrong.append(text)

    threads = [threading.Thread(target=renders, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert len(render_pool.worker_pids()) <= 2


# --- the workers' lives -------------------------------------------------------------------------


def test_the_workers_exit_with_the_process_that_started_them():
    script = (
        "from django.conf import settings; settings.configure()\n"
        "from evaluators.judge.templates import render\n"
        "from evaluators.judge import render_pool\n"
        "render('{{ a }}', {'a': 1}, format='jinja2')\n"
        "print(*render_pool.worker_pids())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids
    deadline = time.monotonic() + 20
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in pids)


def test_a_worker_busy_when_its_process_dies_stops_at_its_cpu_limit():
    script = (
        "import os, threading, time\n"
        "from django.conf import settings; settings.configure(EVALSITE_TEMPLATE_RENDER_SECONDS=1)\n"
        "from evaluators.judge.templates import render\n"
        "from evaluators.judge import render_pool\n"
        "render('warm', {})\n"
        "print(*render_pool.worker_pids(), flush=True)\n"
        f"threading.Thread(target=render, args=({LONG_LOOP!r}, {{}}), kwargs={{'format': 'jinja2'}},"
        " daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "os._exit(0)  # no clean-up: the worker is in the middle of the loop\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids
    deadline = time.monotonic() + 60  # two CPU seconds, on a busy host
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in pids)


def test_a_forked_process_starts_its_own_workers():
    render("warm", {})
    inherited = set(render_pool.worker_pids())
    child = os.fork()
    if child == 0:  # pragma: no cover  (the child reports through its exit status)
        status = 1
        try:
            forgot = render_pool.worker_pids() == []
            rendered = render("{{ a }}", {"a": "child"}, format="jinja2") == "child"
            own = set(render_pool.worker_pids())
            status = 0 if forgot and rendered and own and not own & inherited else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert set(render_pool.worker_pids()) == inherited
    assert_still_renders()


def test_the_worker_imports_nothing_of_django_or_evalsite():
    script = (
        "import sys, evaluators.judge.render_worker\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'evalsite', 'runs'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# --- through the API ----------------------------------------------------------------------------


def judge(template: str) -> dict:
    return {
        "parameters": {
            "connection": "x",
            "template_format": "jinja2",
            "messages": [{"role": "user", "content": template}],
        },
        "inputs": {"question": "Q"},
        "outputs": "A",
    }


@pytest.mark.django_db
@pytest.mark.parametrize("template", [LONG_LOOP, BUILT_NOT_PRINTED[0]], ids=["loop", "center"])
def test_the_render_api_answers_a_hostile_template_with_an_error_not_a_500(
    api, one_second, template
):
    response = api.post("/api/v1/llm-judge/render", judge(template), format="json")
    assert response.status_code == 200  # the request was fine, the template is not
    body = response.json()
    assert body["messages"] is None
    assert body["error"]["code"] == "template_error"
    assert body["error"]["message"] in (
        "the template did not finish within 1 s",
        "the template needed more than 256 MB",
    )

    again = api.post("/api/v1/llm-judge/render", judge("Q: {{ question }}"), format="json")
    assert again.status_code == 200
    assert again.json()["messages"][-1]["content"] == "Q: Q"
