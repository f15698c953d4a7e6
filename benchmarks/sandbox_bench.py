"""Throughput and cold start of the code-evaluator sandbox.

    uv run python benchmarks/sandbox_bench.py [--calls 40000] [--batch 2000]

For a trivial evaluator in each runtime it prints evaluations per second:

- sandboxed: ``run_batch`` through the ``sandbox`` runner, one warm worker (bwrap + seccomp),
  batches of ``--batch`` calls;
- unsandboxed pool: the same, ``inprocess`` runner (same harness and pipes, no jail): the
  difference to the line above is the jail's own cost;
- in-process + JSON: the evaluator called directly in this process (Python) or in a bare
  ``node`` running the same loop (JS/TS), each call's arguments decoded from JSON and its result
  encoded to JSON, which any out-of-process runner must do;
- in-process bare: the same loop with plain function calls and no JSON at all;

the sandboxed/in-process ratios, and the cold start of one jailed worker (median of several).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evaluators.sandbox import get_runner
from evaluators.sandbox.config import Config, load_config
from evaluators.sandbox.pool import registry
from evaluators.sandbox.process import WorkerProcess

CODE = {
    "python": "def evaluate(inputs, outputs, trace):\n    return outputs == inputs['correct_answer']\n",
    "javascript": "function evaluate(inputs, outputs, trace) {\n"
    "  return outputs === inputs.correct_answer;\n}\nmodule.exports = { evaluate };\n",
    "typescript": "export function evaluate(inputs: {correct_answer: string}, outputs: string,"
    " trace: unknown): boolean {\n  return outputs === inputs.correct_answer;\n}\n",
}
CALL = {
    "inputs": {"country": "France", "correct_answer": "Paris"},
    "outputs": "Paris",
    "trace": None,
}

NODE_LOOP = r"""
const vm = require('vm');
const [runtime, n, code] = [process.argv[1], Number(process.argv[2]), process.argv[3]];
let source = code;
if (runtime === 'typescript') {
  source = require(process.argv[4]).transform(code, { transforms: ['typescript', 'imports'] }).code;
}
const module = { exports: {} };
const evaluate = vm.compileFunction(source, ['exports', 'require', 'module'])(module.exports, require, module)
  || module.exports.evaluate;
const line = JSON.stringify([0, %CALL%.inputs, %CALL%.outputs, null]);
const call = JSON.parse(line);
let t = process.hrtime.bigint();
let sink = 0;
for (let i = 0; i < n; i++) {
  const args = JSON.parse(line);
  const value = module.exports.evaluate(args[1], args[2], args[3]);
  sink += JSON.stringify({ ok: true, value }).length;
}
const json = Number(process.hrtime.bigint() - t) / 1e9;
t = process.hrtime.bigint();
for (let i = 0; i < n * 10; i++) sink += module.exports.evaluate(call[1], call[2], call[3]) ? 1 : 0;
const bare = Number(process.hrtime.bigint() - t) / 1e9;
console.log(JSON.stringify({ json: n / json, bare: (n * 10) / bare, sink }));
""".replace("%CALL%", json.dumps(CALL))


def pool_rates(config: Config, total: int, batch: int, rounds: int) -> dict[str, float]:
    """Best evaluations/s per runtime through one warm worker each.

    Runtimes take turns round after round, so a noisy neighbour on the machine weighs on each
    of them alike; the best round counts.
    """
    runner = get_runner(config)
    calls = [CALL] * batch

    def run(runtime: str) -> None:
        results = runner.run_batch(
            config=config,
            project_key="bench",
            runtime=runtime,
            code=CODE[runtime],
            revision_key=f"bench-{runtime}",
            version="2",
            calls=calls,
            timeout_s=5.0,
        )
        assert len(results) == batch and all(r.value is True for r in results), results[-1]

    for runtime in CODE:
        run(runtime)  # start the worker, compile the evaluator (and transpile TypeScript) once
    best = dict.fromkeys(CODE, 0.0)
    for _ in range(rounds):
        for runtime in CODE:
            started = time.perf_counter()
            for _ in range(total // batch):
                run(runtime)
            rate = (total // batch) * batch / (time.perf_counter() - started)
            best[runtime] = max(best[runtime], rate)
    return best


def python_in_process(total: int) -> tuple[float, float]:
    namespace: dict = {}
    exec(compile(CODE["python"], "evaluator.py", "exec"), namespace)  # noqa: S102
    evaluate = namespace["evaluate"]
    line = json.dumps([0, CALL["inputs"], CALL["outputs"], None])
    loads, dumps = json.loads, json.JSONEncoder(allow_nan=False).encode
    started = time.perf_counter()
    for _ in range(total):
        args = loads(line)
        dumps({"ok": True, "value": evaluate(args[1], args[2], args[3])})
    with_json = total / (time.perf_counter() - started)
    inputs, outputs = CALL["inputs"], CALL["outputs"]
    started = time.perf_counter()
    for _ in range(total * 10):
        evaluate(inputs, outputs, None)
    bare = total * 10 / (time.perf_counter() - started)
    return with_json, bare


def node_in_process(config: Config, runtime: str, total: int) -> tuple[float, float]:
    sucrase = str(Path(config.node_modules, "sucrase"))
    out = subprocess.run(
        [config.node, "-e", NODE_LOOP, runtime, str(total), CODE[runtime], sucrase],
        capture_output=True,
        text=True,
        check=True,
    )
    rates = json.loads(out.stdout)
    return rates["json"], rates["bare"]


def cold_start_ms(config: Config, runtime: str, samples: int = 9) -> float:
    times = []
    for _ in range(samples):
        worker = WorkerProcess(config, runtime, sandboxed=True)
        times.append(worker.start_ms)
        worker.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per round and runtime")
    parser.add_argument("--batch", type=int, default=2000, help="calls per run_batch")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    base = load_config().with_(workers_per_pool=1)
    jailed, bare = base.with_(runner="sandbox"), base.with_(runner="inprocess")
    cold_start_ms(jailed, "python", 1)  # the first start pays for working out the binds
    sandboxed = pool_rates(jailed, args.calls, args.batch, args.rounds)
    pooled = pool_rates(bare, args.calls, args.batch, args.rounds)
    registry().close_all()
    print(
        f"{'runtime':<11} {'sandboxed/s':>12} {'unsandboxed pool/s':>19} {'in-process+JSON/s':>18} "
        f"{'in-process bare/s':>18} {'ratio pool':>10} {'ratio JSON':>10} {'ratio bare':>10} "
        f"{'cold start':>11}"
    )
    for runtime in CODE:
        if runtime == "python":
            with_json, plain = python_in_process(args.calls * 2)
        else:
            with_json, plain = node_in_process(base, runtime, args.calls * 10)
        cold = cold_start_ms(jailed, runtime)
        rate = sandboxed[runtime]
        print(
            f"{runtime:<11} {rate:>12,.0f} {pooled[runtime]:>19,.0f} {with_json:>18,.0f} "
            f"{plain:>18,.0f} {rate / pooled[runtime]:>10.2f} {rate / with_json:>10.2f} "
            f"{rate / plain:>10.4f} {cold:>8.1f} ms"
        )
    ts_vs_js = sandboxed["typescript"] / sandboxed["javascript"]
    print(f"TypeScript / JavaScript (sandboxed): {ts_vs_js:.2f}")


if __name__ == "__main__":
    main()
