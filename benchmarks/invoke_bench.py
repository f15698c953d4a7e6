"""What one code evaluation costs through the service path, beside the evaluator itself.

    uv run python benchmarks/invoke_bench.py [--calls 2000] [--batch 1000] [--rounds 5]
        [--runtimes python,javascript] [--runner sandbox|inprocess] [--quota] [--root DIR]

For a trivial evaluator in each runtime, in one process, side by side:

- bare: the evaluator function called in a loop in-process (Python here; JavaScript in a bare
  ``node`` running the same loop), no JSON, no sandbox;
- in-jail: what the worker measured around the evaluator call itself (``duration_ms``);
- single call: one ``evaluators.services.evaluation_invoke`` (what the invoke API and the
  playground call; an online rule evaluating one trace takes the same path below it), one
  item, through a warm pool;
  median and 90th percentile over ``--calls`` calls taken in ``--rounds`` rounds, and the
  CPU time the calling thread spent on one (less sensitive to a busy machine than the wall
  time, which includes waiting for the worker to be scheduled);
- batched: ``evaluations_invoke_many`` with ``--batch`` items (what the run engine calls), per
  item, median over the rounds;

and the overhead of each path: its time less the in-jail time. No database query: the evaluations
are ad hoc (kind and parameters, no revision, no project). ``--quota`` adds a project, so the
single call also holds one of the project's interactive slots (two Redis round trips, to
``REDIS_URL``) as the API does. ``--runner inprocess`` measures the same without the jail.

``--root /tmp/before`` imports evalsite from another checkout (say, a ``git worktree`` of an
earlier commit): run both in one session, one after the other, for a before/after that shares
the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CODE = {
    "python": "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n",
    "javascript": "function evaluate(inputs, outputs, trace) {\n"
    "  return outputs === inputs.correct_answer;\n}\nmodule.exports = { evaluate };\n",
}
INPUTS = {"country": "France", "correct_answer": "Paris"}
OUTPUTS = "Paris"

NODE_LOOP = r"""
const [n, code] = [Number(process.argv[1]), process.argv[2]];
const module = { exports: {} };
new Function('module', 'exports', code)(module, module.exports);
const evaluate = module.exports.evaluate;
const inputs = { country: 'France', correct_answer: 'Paris' };
let sink = 0;
for (let i = 0; i < n; i++) sink += evaluate(inputs, 'Paris', null) ? 1 : 0;
const t = process.hrtime.bigint();
for (let i = 0; i < n; i++) sink += evaluate(inputs, 'Paris', null) ? 1 : 0;
console.log(JSON.stringify({ ns: Number(process.hrtime.bigint() - t) / n, sink }));
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="single calls per runtime")
    parser.add_argument("--batch", type=int, default=1000, help="items of one batched call")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runtimes", default="python,javascript")
    parser.add_argument("--runner", choices=["sandbox", "inprocess"], default="sandbox")
    parser.add_argument("--quota", action="store_true", help="hold a project's interactive slot")
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="import evalsite from this checkout: before/after"
    )
    return parser.parse_args()


def setup(root: Path, runner: str) -> None:
    """Import Django (and with it evaluators) from ``root``, with the runner chosen."""
    sys.path.insert(0, str(root.resolve()))
    os.chdir(root)  # Celery's Django fixup puts the working directory first on sys.path
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
    os.environ["EVALSITE_CODE_RUNNER"] = runner
    import django

    django.setup()


def bare_python_ns(calls: int) -> float:
    namespace: dict = {}
    exec(compile(CODE["python"], "evaluator.py", "exec"), namespace)  # noqa: S102
    evaluate = namespace["evaluate"]
    started = time.perf_counter_ns()
    for _ in range(calls):
        evaluate(INPUTS, OUTPUTS, None)
    return (time.perf_counter_ns() - started) / calls


def bare_node_ns(calls: int) -> float:
    out = subprocess.run(
        ["node", "-e", NODE_LOOP, str(calls), CODE["javascript"]],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout)["ns"])


def measure(runtime: str, args: argparse.Namespace, project) -> dict[str, float]:
    from evaluators.services import evaluation_invoke, evaluations_invoke_many

    parameters = {"runtime": runtime, "code": CODE[runtime], "version": "2"}

    def single():
        return evaluation_invoke(
            kind="code", parameters=parameters, inputs=INPUTS, outputs=OUTPUTS, project=project
        )

    items = [(INPUTS, OUTPUTS, None)] * args.batch

    def batched():
        return evaluations_invoke_many(kind="code", parameters=parameters, items=items)

    for _ in range(200):  # start the worker, compile the evaluator, warm every cache
        check(single())
    for evaluation in batched():
        check(evaluation)
    single_ns: list[int] = []
    host_cpu_ns: list[int] = []
    inside_ms: list[float] = []
    batch_ns: list[float] = []
    per_round = max(args.calls // args.rounds, 1)
    for _ in range(args.rounds):
        for _ in range(per_round):
            cpu = time.thread_time_ns()
            started = time.perf_counter_ns()
            evaluation = single()
            single_ns.append(time.perf_counter_ns() - started)
            host_cpu_ns.append(time.thread_time_ns() - cpu)
            inside_ms.append(evaluation.duration_ms)
        check(evaluation)
        started = time.perf_counter_ns()
        evaluations = batched()
        batch_ns.append((time.perf_counter_ns() - started) / args.batch)
        check(evaluations[-1])
    bare = bare_python_ns(200_000) if runtime == "python" else bare_node_ns(2_000_000)
    return {
        "bare": bare / 1000,
        "inside": statistics.median(inside_ms) * 1000,
        "single": statistics.median(single_ns) / 1000,
        "single_p90": statistics.quantiles(single_ns, n=10)[-1] / 1000,
        "host_cpu": statistics.median(host_cpu_ns) / 1000,
        "batched": statistics.median(batch_ns) / 1000,
    }


def check(evaluation) -> None:
    assert evaluation.status == "success", evaluation
    assert evaluation.outputs == {"success": True}, evaluation


def main() -> None:
    args = parse_args()
    setup(args.root, args.runner)
    import evaluators
    from evalsite.models import Project
    from evaluators.sandbox.pool import registry

    # Never saved: the quota only needs its id, and the pool its key.
    project = Project(pk=2_000_000_000, slug="invoke-bench") if args.quota else None
    runtimes = args.runtimes.split(",")
    figures = {runtime: measure(runtime, args, project) for runtime in runtimes}
    registry().close_all()
    quota = " with a project's interactive slot (Redis)" if args.quota else ""
    print(
        f"evalsite from {Path(evaluators.__file__).parents[1]}; runner {args.runner}; single calls: median of "
        f"{args.calls}{quota}; batched: {args.batch} items a call, median of {args.rounds}"
    )
    print(
        f"{'runtime':<11} {'bare':>8} {'in-jail':>8} {'single':>8} {'p90':>8} {'overhead':>9} "
        f"{'host CPU':>9} {'batched':>8} {'overhead':>9}   (µs per evaluation)"
    )
    for runtime, f in figures.items():
        print(
            f"{runtime:<11} {f['bare']:>8.2f} {f['inside']:>8.2f} {f['single']:>8.1f} "
            f"{f['single_p90']:>8.1f} {f['single'] - f['inside']:>9.1f} {f['host_cpu']:>9.1f} "
            f"{f['batched']:>8.2f} {f['batched'] - f['inside']:>9.2f}"
        )
    print(
        "overhead: the path's time less the evaluator's own time measured inside the worker; "
        "host CPU: this thread's CPU time for one single call"
    )


if __name__ == "__main__":
    main()
