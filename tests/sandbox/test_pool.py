"""The warm pool: replacement after faults, project separation, recycling, concurrency, runners."""

from __future__ import annotations

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evaluators.sandbox import SandboxUnavailable, run_batch, sandbox_status
from evaluators.sandbox.pool import registry
from evaluators.sandbox.process import CHUNK_CALLS, WorkerProcess, encode_chunks, line_bytes

from .conftest import call, error_code, fresh_project, run

COUNTER_PY = """
    calls = 0
    def evaluate(inputs, outputs, trace):
        global calls
        calls += 1
        if inputs.get("crash"):
            import os
            os._exit(3)
        return calls
"""
COUNTER_JS = """
    let calls = 0;
    function evaluate(inputs) {
      calls += 1;
      if (inputs.crash) process.exit(3);
      if (inputs.abort) process.abort();
      return calls;
    }
"""


@pytest.mark.parametrize(("runtime", "code"), [("python", COUNTER_PY), ("javascript", COUNTER_JS)])
def test_it_replaces_a_crashed_worker_and_keeps_finished_results(config, runtime, code):
    calls = [call(), call(), call({"crash": True}), call(), call()]
    results = run(config, runtime, code, calls, project=fresh_project())
    assert [r.value for r in results[:2]] == [1, 2]
    assert error_code(results[2]) == "worker_crashed"
    assert "status 3" in results[2].error["message"]
    # The rest ran on a fresh worker: its module-level counter started again.
    assert [r.value for r in results[3:]] == [1, 2]


def test_it_bounds_request_lines_by_bytes_as_well_as_by_calls():
    calls = [[{"n": n}, "x" * 100, None] for n in range(10)]
    lines = encode_chunks(calls, 400)
    assert all(len(line) <= 400 for line in lines)
    assert [args for line in lines for args in json.loads(line)] == calls
    assert len(lines) == 4  # three calls of 120 bytes a line
    # A call larger than the budget travels alone; small calls still share lines of CHUNK_CALLS.
    assert [len(json.loads(line)) for line in encode_chunks(calls[:3], 50)] == [1, 1, 1]
    small = [[{}, "x", None]] * (CHUNK_CALLS + 1)
    assert [len(json.loads(line)) for line in encode_chunks(small, 1 << 20)] == [CHUNK_CALLS, 1]


def test_it_derives_the_line_budget_from_the_worker_memory_limit(config):
    assert line_bytes(config, "python") == config.memory_mb * (1 << 20) // 16
    assert line_bytes(config, "typescript") == config.node_memory_mb * (1 << 20) // 16


LONG_INPUTS_PY = """
    def evaluate(inputs, outputs, trace):
        return [inputs["n"], len(inputs["said"]), inputs["said"][-1]["content"]]
"""
LONG_INPUTS_JS = """
    function evaluate(inputs) {
      return [inputs.n, inputs.said.length, inputs.said[inputs.said.length - 1].content];
    }
"""


@pytest.mark.parametrize(
    ("runtime", "code"), [("python", LONG_INPUTS_PY), ("javascript", LONG_INPUTS_JS)]
)
def test_it_runs_a_batch_larger_than_the_worker_could_decode_at_once(config, runtime, code):
    # Eight calls of 1/40 of the memory limit each (58 bytes of JSON a message): decoded in
    # one piece, their objects would take more than the whole limit.
    size = config.memory_mb if runtime == "python" else config.node_memory_mb
    count = size * (1 << 20) // 40 // 58
    said = [{"role": "user", "content": f"élan № {i} ✓"} for i in range(count)]
    calls = [call({"n": n, "said": said}) for n in range(8)]
    results = run(config, runtime, code, calls, project=fresh_project(), timeout_s=30)
    assert [r.error for r in results] == [None] * 8
    assert [r.value for r in results] == [[n, count, f"élan № {count - 1} ✓"] for n in range(8)]


def test_it_reports_a_node_abort_as_a_crash(config):
    results = run(config, "javascript", COUNTER_JS, [call({"abort": True}), call()])
    assert error_code(results[0]) == "worker_crashed"
    # As pid 1 of its namespace, the worker cannot die of its own SIGABRT; abort() ends in SIGSEGV.
    assert "signal" in results[0].error["message"]
    assert results[1].value == 1


def test_it_retries_the_rest_of_a_batch_after_a_timeout(config):
    code = """
        import time
        def evaluate(inputs, outputs, trace):
            if inputs.get("hang"):
                time.sleep(60)
            return inputs["n"]
    """
    calls = [call({"n": 0}), call({"n": 1, "hang": True}), call({"n": 2})]
    results = run(config, "python", code, calls, timeout_s=0.5)
    assert [results[0].value, error_code(results[1]), results[2].value] == [0, "timeout", 2]


def test_it_stops_a_batch_after_consecutive_faults(config):
    code = "import time\ndef evaluate(i, o, t):\n    time.sleep(60)\n"
    results = run(config, "python", code, [call() for _ in range(6)], timeout_s=0.3)
    codes = [error_code(r) for r in results]
    assert codes == ["timeout"] * 3 + ["aborted"] * 3


def test_it_never_shares_a_worker_between_projects(config):
    leak = {
        "python": "import builtins\ndef evaluate(i, o, t):\n    builtins.LEAK = i.get('set')\n    return 1\n",
        "javascript": "function evaluate(i) { globalThis.LEAK = i.set; return 1; }",
    }
    peek = {
        "python": "import builtins\ndef evaluate(i, o, t):\n    return getattr(builtins, 'LEAK', 'unseen')\n",
        "javascript": "function evaluate() { return typeof LEAK === 'undefined' ? 'unseen' : LEAK; }",
    }
    for runtime in ("python", "javascript"):
        project_a, project_b = fresh_project(), fresh_project()
        run(config, runtime, leak[runtime], [call({"set": "secret-of-a"})], project=project_a)
        # Same project: one worker, shared process state (the project is the trust boundary).
        assert run(config, runtime, peek[runtime], project=project_a)[0].value == "secret-of-a"
        assert run(config, runtime, peek[runtime], project=project_b)[0].value == "unseen"


def test_it_recycles_a_worker_after_n_calls(config):
    recycling = config.with_(recycle_after=3)
    results = run(
        recycling, "python", COUNTER_PY, [call() for _ in range(7)], project=fresh_project()
    )
    assert [r.value for r in results] == [1, 2, 3, 1, 2, 3, 1]
    results = run(
        recycling, "javascript", COUNTER_JS, [call() for _ in range(4)], project=fresh_project()
    )
    assert [r.value for r in results] == [1, 2, 3, 1]


def test_it_compiles_each_revision_once_per_worker(config):
    project = fresh_project()
    first = run(config, "python", COUNTER_PY, [call(), call()], project=project, revision_key="r1")
    again = run(config, "python", COUNTER_PY, [call()], project=project, revision_key="r1")
    other = run(config, "python", COUNTER_PY, [call()], project=project, revision_key="r2")
    assert [r.value for r in first + again + other] == [1, 2, 3, 1]


def test_it_serves_concurrent_threads(config):
    code = "def evaluate(inputs, outputs, trace):\n    return inputs['n'] * 2\n"
    failures: list[object] = []

    def worker(offset: int) -> None:
        for _ in range(5):
            numbers = list(range(offset, offset + 50))
            results = run(
                config,
                "python",
                code,
                [call({"n": n}) for n in numbers],
                project="concurrent",
                revision_key="double",
            )
            if [r.value for r in results] != [n * 2 for n in numbers]:
                failures.append(results)

    threads = [threading.Thread(target=worker, args=(i * 1000,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = registry().stats()["concurrent/python"]
    assert stats["workers"] <= config.workers_per_pool


def test_it_runs_through_the_public_api():
    results = run_batch(
        project_key=fresh_project(),
        runtime="python",
        code="def evaluate(inputs, outputs, trace):\n    return outputs == inputs['answer']\n",
        revision_key="public",
        version="2",
        calls=[{"inputs": {"answer": "Paris"}, "outputs": "Paris", "trace": None}],
    )
    assert results[0].status == "success"
    assert results[0].value is True


def test_it_refuses_to_run_without_bwrap(sandbox_env):
    sandbox_env("EVALSITE_SANDBOX_BWRAP", "/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match="bwrap not found at /nonexistent/bwrap"):
        run_batch(
            project_key="acme",
            runtime="python",
            code="def evaluate(i, o, t):\n    return 1\n",
            revision_key="x",
            version="2",
            calls=[call()],
        )
    status = sandbox_status()
    assert status["available"] is False
    assert "bwrap not found at /nonexistent/bwrap" in status["problem"]


def test_it_reports_the_sandbox_as_available():
    status = sandbox_status()
    assert status["available"] is True, status
    assert status["runner"] == "sandbox"
    assert status["problem"] is None


@pytest.mark.parametrize("runtime", ["python", "javascript", "typescript"])
def test_it_runs_unsandboxed_with_a_loud_warning(config, runtime, caplog):
    unsafe = config.with_(runner="inprocess")
    code = {
        "python": "import os\ndef evaluate(i, o, t):\n    return os.path.exists('/work/main')\n",
        "javascript": "function evaluate() { return require('fs').existsSync('/work/main'); }",
        "typescript": "function evaluate(): boolean { return require('fs').existsSync('/work/main'); }",
    }[runtime]
    with caplog.at_level(logging.WARNING, logger="evaluators.sandbox"):
        results = run(unsafe, runtime, code, project=fresh_project())
    assert results[0].value is True  # the host's files: no jail
    assert "UNSANDBOXED" in caplog.text


def test_it_still_times_out_unsandboxed_code(config):
    unsafe = config.with_(runner="inprocess")
    results = run(
        unsafe, "python", "def evaluate(i, o, t):\n    while True:\n        pass\n", timeout_s=0.3
    )
    assert error_code(results[0]) == "timeout"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="needs root and a world-readable system Python",
)
def test_it_drops_to_an_unprivileged_host_uid_when_the_runtime_allows(config):
    system_python = config.with_(python="/usr/bin/python3")
    code = "import os\ndef evaluate(i, o, t):\n    return os.getuid()\n"
    for runtime, cfg in (("python", system_python), ("javascript", config)):
        project = fresh_project()
        run(
            cfg,
            runtime,
            code if runtime == "python" else "function evaluate() { return 1; }",
            project=project,
        )
        assert _host_uids(project, runtime) == {65534}


def _host_uids(project: str, runtime: str) -> set[int]:
    """The host-side uid of each idle worker of a pool (as the kernel sees it, not the jail)."""
    uids = set()
    for pool in registry().pools.values():
        if pool.project_key == project and pool.runtime == runtime:
            for worker in pool.idle:
                status = Path(f"/proc/{worker.spawned.pid}/status").read_text()
                uids.add(int(status.split("Uid:")[1].split()[0]))
    return uids


def test_it_leaves_no_process_behind(config):
    project = fresh_project()
    run(config, "python", COUNTER_PY, project=project)
    run(config, "javascript", COUNTER_JS, project=project)
    registry().close_all()
    children = _children(os.getpid())
    assert not [c for c in children if "bwrap" in c or "worker." in c], children


def _children(pid: int) -> list[str]:
    found = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            found.append(Path(f"/proc/{child}/cmdline").read_text().replace("\0", " "))
        except OSError:
            continue
    return found


BURN_PY = """
    import time
    calls = 0
    def evaluate(inputs, outputs, trace):
        global calls
        calls += 1
        end = time.process_time() + inputs["cpu"]
        while time.process_time() < end:
            pass
        return calls
"""


def test_it_stops_a_worker_at_its_cpu_time_limit(config):
    frugal = config.with_(cpu_seconds=1)
    results = run(frugal, "python", BURN_PY, [call({"cpu": 5})], timeout_s=10)
    assert error_code(results[0]) == "cpu_limit"


def test_it_recycles_a_worker_that_used_half_its_cpu_time(config):
    frugal, project = config.with_(cpu_seconds=2), fresh_project()
    first = run(frugal, "python", BURN_PY, [call({"cpu": 1.1})], project=project, revision_key="b")
    # More than half of its 2 s went on that call: the next batch finds a fresh worker.
    again = run(frugal, "python", BURN_PY, [call({"cpu": 0})], project=project, revision_key="b")
    assert [first[0].value, again[0].value] == [1, 1]
    control = run(frugal, "python", BURN_PY, [call({"cpu": 0})], project=project, revision_key="b")
    assert control[0].value == 2


def test_it_replaces_a_worker_killed_while_idle_without_blaming_anyone(config):
    project = fresh_project()
    run(config, "python", COUNTER_PY, project=project, revision_key="idle")
    (pool,) = [p for p in registry().pools.values() if p.project_key == project]
    os.kill(pool.idle[0].spawned.pid, signal.SIGKILL)
    time.sleep(0.1)
    results = run(config, "python", COUNTER_PY, [call(), call()], project=project)
    assert [r.value for r in results] == [1, 2]


# -- health checks without a /proc read per call ------------------------------------------------
@pytest.fixture
def proc_reads(monkeypatch):
    """How often a worker's CPU time is read from /proc (the real read still happens)."""
    reads = []
    cpu_used = WorkerProcess.cpu_used

    def counted(worker):
        reads.append(worker.spawned.pid)
        return cpu_used(worker)

    monkeypatch.setattr(WorkerProcess, "cpu_used", counted)
    return reads


def test_it_reads_proc_only_when_a_worker_could_have_used_half_its_cpu(config, proc_reads):
    project = fresh_project()
    for _ in range(30):
        run(config, "python", COUNTER_PY, project=project, revision_key="quick")
    # 30 quick calls take far less wall time than half of cpu_seconds, on every core at once.
    assert proc_reads == []


def test_it_recycles_a_worker_whose_short_calls_add_up_to_half_its_cpu(config, proc_reads):
    frugal, project = config.with_(cpu_seconds=2), fresh_project()
    values = []
    for _ in range(14):
        results = run(
            frugal, "python", BURN_PY, [call({"cpu": 0.15})], project=project, revision_key="b"
        )
        assert results[0].status == "success", results[0].error
        values.append(results[0].value)
    # Replaced once past 1 s (each call 0.15 s), long before RLIMIT_CPU's 2 s could stop it.
    restart = values.index(1, 1)
    assert values[:restart] == list(range(1, restart + 1))
    assert 6 <= restart <= 12
    assert proc_reads, "the CPU time was never read"


def test_it_replaces_a_worker_that_ran_out_of_memory_whatever_the_health_checks(config, proc_reads):
    code = """
        calls = 0
        def evaluate(inputs, outputs, trace):
            global calls
            calls += 1
            if inputs.get("hog"):
                data = bytearray(1024 * 1024 * 1024)
            return calls
    """
    project = fresh_project()
    calls = [call(), call({"hog": True}), call()]
    results = run(config, "python", code, calls, project=project, revision_key="hog")
    assert [results[0].value, error_code(results[1]), results[2].value] == [1, "memory_limit", 1]
    # The kernel's limit stopped it and the worker asked to go: no /proc read was involved.
    assert proc_reads == []
    assert run(config, "python", code, project=project, revision_key="hog")[0].value == 2


# -- paths resolved once per process -------------------------------------------------------------
OK_VERSION = "import platform\ndef evaluate(i, o, t):\n    return platform.python_version()\n"


def test_it_reports_an_interpreter_that_went_away_instead_of_running_the_old_one(config, tmp_path):
    link = tmp_path / "python3"
    link.symlink_to(config.python)
    linked, project = config.with_(python=str(link)), fresh_project()
    assert run(linked, "python", OK_VERSION, project=project)[0].status == "success"
    registry().close_all()
    link.unlink()
    link.symlink_to(tmp_path / "gone" / "python3")
    for _ in range(2):  # the failure is reported, then checked again, never worked around
        with pytest.raises(SandboxUnavailable, match=f"Python {tmp_path}/gone/python3: No such"):
            run(linked, "python", OK_VERSION, project=project)
    link.unlink()
    link.symlink_to(config.python)
    assert run(linked, "python", OK_VERSION, project=project)[0].status == "success"


OTHER_PYTHON = "/usr/bin/python3.11"


def _version_of(python: str) -> str:
    query = [python, "-c", "import platform; print(platform.python_version())"]
    return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(
    not os.path.exists(OTHER_PYTHON) or platform.python_version() == _version_of(OTHER_PYTHON),
    reason="needs a second interpreter of another version",
)
def test_it_starts_workers_with_the_interpreter_a_path_now_names(config, tmp_path):
    link = tmp_path / "python3"
    link.symlink_to(OTHER_PYTHON)
    # Unjailed: the host's own interpreter may sit where the jail's uid cannot read it.
    linked, project = config.with_(python=str(link), runner="inprocess"), fresh_project()
    assert run(linked, "python", OK_VERSION, project=project)[0].value == _version_of(OTHER_PYTHON)
    registry().close_all()
    link.unlink()
    link.symlink_to(os.path.realpath(sys._base_executable))
    assert run(linked, "python", OK_VERSION, project=project)[0].value == platform.python_version()


# -- who is blamed when nothing comes back -------------------------------------------------------
HANG_AT_LOAD = {
    "python": "import time\ntime.sleep(60)\ndef evaluate(i, o, t):\n    return 1\n",
    "javascript": "while (true) {}\nfunction evaluate() { return 1; }",
}
HANG_IN_CALL = {
    "python": "import time\ndef evaluate(i, o, t):\n"
    "    if i.get('hang'):\n        time.sleep(60)\n    return i['n']\n",
    "javascript": "function evaluate(i) { while (i.hang) {} return i.n; }",
}


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_it_blames_a_load_that_never_ends_on_the_load(config, runtime):
    calls = [call(), call(), call()]
    results = run(config, runtime, HANG_AT_LOAD[runtime], calls, timeout_s=0.5)
    assert [error_code(r) for r in results] == ["timeout"] * 3
    assert {r.error["message"] for r in results} == {
        "While loading the evaluator: loading the evaluator did not finish within 0.5 s; "
        "the worker was stopped."
    }


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_it_blames_a_call_that_never_ends_on_that_call_when_the_worker_holds_the_code(
    config, runtime
):
    project, code = fresh_project(), HANG_IN_CALL[runtime]
    # The pool's one worker compiles the revision now; the next batch finds it held.
    assert run(config, runtime, code, [call({"n": 0})], project=project, revision_key="held")
    calls = [call({"n": 1, "hang": True}), call({"n": 2}), call({"n": 3})]
    results = run(config, runtime, code, calls, project=project, revision_key="held", timeout_s=0.5)
    assert error_code(results[0]) == "timeout"
    assert results[0].error["message"].startswith("this call did not finish within 0.5 s")
    assert [r.value for r in results[1:]] == [2, 3]
