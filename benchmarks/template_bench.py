"""What rendering one judge prompt costs: curly and jinja2, through ``render_all``.

    uv run python benchmarks/template_bench.py [--renders 5000] [--threads 8]

Renders the default correctness prompt (a system and a user message, as a judge does once per
scenario) over the template variables of one testcase row, ``--renders`` times in each format,
and prints the mean and median microseconds per call:

- in-process: ``rendering.render_here``, the renderer itself, called in this process (what
  ``render_all`` did before templates rendered in worker processes);
- render_all: through a render worker, from one thread, then from ``--threads`` threads at once
  (as a batch's judge threads do); the difference to the line above is the boundary's cost.

It also prints the first call of the process, which starts a render worker. No database or
Redis is needed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SYSTEM = (
    "You are an impartial grader. Decide how correct the candidate answer is, taking the "
    "reference answer as the truth."
)
CURLY = "Input:\n{{question}}\n\nReference answer:\n{{reference}}\n\nCandidate answer:\n{{outputs}}"
JINJA = (
    "Input:\n{{ question }}\n\n{% if reference %}Reference answer:\n{{ reference }}\n\n{% endif %}"
    "Candidate answer:\n{{ outputs }}"
)


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    import django

    django.setup()


def timings(render, renders: int, threads: int) -> list[float]:
    def one(_: int) -> float:
        started = time.perf_counter()
        render()
        return (time.perf_counter() - started) * 1e6

    if threads == 1:
        return [one(i) for i in range(renders)]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, range(renders)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--renders", type=int, default=5000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    setup_django()
    from evaluators.judge.context import template_variables
    from evaluators.judge.rendering import render_here
    from evaluators.judge.templates import render_all

    variables = template_variables(
        inputs={"country": "France", "question": "What is the capital of France?",
                "correct_answer": "Paris", "meta": {"source": "atlas", "year": 2024}},
        outputs="The capital of France is Paris.",
        trace=None,
        correct_answer_key="correct_answer",
        parameters={"connection": "bench", "model": "judge-1", "temperature": 0.0},
    )  # fmt: skip
    started = time.perf_counter()
    render_all([SYSTEM, CURLY], variables)
    print(f"first call (starts the render workers): {(time.perf_counter() - started) * 1e3:.1f} ms")
    for fmt, template in (("curly", CURLY), ("jinja2", JINJA)):
        calls = {
            "in-process": lambda fmt=fmt, t=template: render_here(fmt, [SYSTEM, t], variables),
            "render_all": lambda fmt=fmt, t=template: render_all(
                [SYSTEM, t], variables, format=fmt
            ),
        }
        for name, render in calls.items():
            render()
            for threads in (1, args.threads) if name == "render_all" else (1,):
                spent = timings(render, args.renders, threads)
                print(f"{fmt:6} {name:10} {threads:2} thread(s): "
                      f"mean {statistics.fmean(spent):7.1f} us, "
                      f"median {statistics.median(spent):7.1f} us ({args.renders} calls)")  # fmt: skip


if __name__ == "__main__":
    main()
