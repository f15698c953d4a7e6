"""Every attack class ends as an error (or a harmless value) while the host stays intact."""

from __future__ import annotations

import os
import socket
import time

import pytest

from .conftest import call, error_code, fresh_project, one, run

OK_PY = "def evaluate(inputs, outputs, trace):\n    return 'alive'\n"
OK_JS = "function evaluate() { return 'alive'; }"


def assert_pool_still_works(config, runtime, project="acme"):
    code = OK_PY if runtime == "python" else OK_JS
    assert one(config, runtime, code, project=project).value == "alive"


# -- host files ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/etc/shadow",
        "/etc/passwd",
        "/work/main/pyproject.toml",
        "/root/.bashrc",
        "/root",
        "/home",
        "/var/run/postgresql/.s.PGSQL.5432",
        __file__,
    ],
)
def test_it_cannot_read_host_files_from_python(config, path):
    code = f"""
        import os
        def evaluate(inputs, outputs, trace):
            if os.path.isdir({path!r}):
                return os.listdir({path!r})
            return open({path!r}).read()
    """
    result = one(config, "python", code)
    assert error_code(result) == "exception"
    assert result.error["type"] == "FileNotFoundError"


def test_it_cannot_read_host_files_from_node(config):
    code = """
        const fs = require('fs');
        function evaluate(inputs) { return fs.readFileSync(inputs.path, 'utf8'); }
    """
    paths = ["/etc/shadow", "/etc/passwd", "/work/main/pyproject.toml", "/root/.bashrc"]
    results = run(config, "javascript", code, [call({"path": p}) for p in paths])
    assert [r.error["message"].split(":")[0] for r in results] == ["ENOENT"] * len(paths)


def test_it_sees_only_the_runtime_in_its_root(config):
    code = """
        import os
        def evaluate(inputs, outputs, trace):
            return sorted(os.listdir("/"))
    """
    assert one(config, "python", code).value == ["dev", "lib64", "opt", "proc", "tmp", "usr"]


def test_it_cannot_write_to_its_root_or_to_proc(config):
    code = """
        def evaluate(inputs, outputs, trace):
            open(inputs["path"], "w").write("x")
    """
    paths = [
        "/opt/evalsite/worker.py",
        "/usr/lib/x",
        "/proc/sys/kernel/printk_ratelimit",
        "/dev/shm/x",
    ]
    results = run(config, "python", code, [call({"path": p}) for p in paths])
    assert [r.error["type"] for r in results] == ["OSError"] * len(paths)
    assert all("Read-only file system" in r.error["message"] for r in results)


# -- host environment ---------------------------------------------------------------------------
def test_it_cannot_see_the_host_environment(config, monkeypatch):
    monkeypatch.setenv("EVALSITE_CANARY_SECRET", "s3cr3t-canary")
    code = """
        import os
        def read(path):
            try:
                return open(path, "rb").read().decode()
            except OSError as exc:
                return type(exc).__name__
        def evaluate(inputs, outputs, trace):
            return {
                "environ": dict(os.environ),
                "proc1": read("/proc/1/environ"),
                "self": read("/proc/self/environ"),
                "host": read(f"/proc/{inputs['host_pid']}/environ"),
                "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
            }
    """
    value = one(
        config, "python", code, project=fresh_project(), calls=[call({"host_pid": os.getpid()})]
    ).value
    assert "s3cr3t-canary" not in repr(value)
    assert set(value["environ"]) <= {"LANG", "TZ", "PWD"}
    assert value["host"] == "FileNotFoundError"
    assert value["pids"] == ["1"]


def test_it_cannot_see_the_host_environment_from_node(config, monkeypatch):
    monkeypatch.setenv("EVALSITE_CANARY_SECRET", "s3cr3t-canary")
    code = """
        const fs = require('fs');
        function evaluate() {
          return { env: process.env, proc1: fs.readFileSync('/proc/1/environ', 'utf8') };
        }
    """
    value = one(config, "javascript", code, project=fresh_project()).value
    assert "s3cr3t-canary" not in repr(value)
    assert set(value["env"]) <= {"LANG", "TZ", "PWD"}


# -- network ------------------------------------------------------------------------------------
def test_it_cannot_open_sockets_to_postgres(config):
    code = """
        import socket
        def evaluate(inputs, outputs, trace):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.connect(("127.0.0.1", 5432))
            return "connected"
    """
    result = one(config, "python", code)
    assert result.error["type"] == "PermissionError"


def test_it_cannot_reach_the_postgres_unix_socket(config):
    code = """
        import socket
        def evaluate(inputs, outputs, trace):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect("/var/run/postgresql/.s.PGSQL.5432")
            return "connected"
    """
    assert one(config, "python", code).error["type"] == "PermissionError"


def test_it_has_no_network_interface_but_an_unconfigured_loopback(config):
    code = """
        def evaluate(inputs, outputs, trace):
            lines = open("/proc/net/dev").read().splitlines()[2:]
            return [line.split(":")[0].strip() for line in lines]
    """
    assert one(config, "python", code).value == ["lo"]


def test_it_cannot_connect_from_node(config):
    code = """
        const net = require('net');
        async function evaluate() {
          return await new Promise((resolve, reject) => {
            const s = net.connect(5432, '127.0.0.1', () => resolve('connected'));
            s.on('error', reject);
          });
        }
    """
    result = one(config, "javascript", code)
    assert error_code(result) == "exception"
    assert "EPERM" in result.error["message"] or "EACCES" in result.error["message"]


def test_it_leaves_the_hosts_postgres_reachable_for_the_host():
    with socket.create_connection(("127.0.0.1", 5432), timeout=2):
        pass


# -- processes ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "while True: os.fork()",
        "subprocess.run(['/opt/python/bin/python3.11', '-c', 'pass'])",
        "threading.Thread(target=time.sleep, args=(100,)).start()",
        "os.kill(os.getppid(), signal.SIGKILL)",
        "os.kill(-1, signal.SIGKILL)",
    ],
)
def test_it_denies_processes_and_signals_from_python(config, body):
    code = f"""
        import os, signal, subprocess, threading, time
        def evaluate(inputs, outputs, trace):
            {body}
            return "escaped"
    """
    result = one(config, "python", code)
    assert result.status == "error", result
    assert result.error["type"] in {"PermissionError", "RuntimeError"}
    assert_pool_still_works(config, "python")


@pytest.mark.parametrize(
    "body",
    [
        "require('child_process').execFileSync('/usr/bin/node', ['-e', '1'])",
        "const r = require('child_process').spawnSync('/usr/bin/node'); if (r.error) throw r.error",
        "process.kill(process.ppid, 'SIGKILL')",
        "process.kill(-1, 'SIGKILL')",
    ],
)
def test_it_denies_processes_and_signals_from_node(config, body):
    code = f"function evaluate() {{ {body}; return 'escaped'; }}"
    result = one(config, "javascript", code)
    assert result.status == "error", result
    assert "EPERM" in result.error["message"] or result.error["code"] == "exception"
    assert_pool_still_works(config, "javascript")


def test_it_lets_node_use_threads(config):
    code = """
        const { Worker } = require('worker_threads');
        async function evaluate() {
          return await new Promise((resolve, reject) => {
            const w = new Worker('require("worker_threads").parentPort.postMessage(6 * 7)', { eval: true });
            w.on('message', resolve);
            w.on('error', reject);
          });
        }
    """
    assert one(config, "javascript", code).value == 42


# -- resources ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "body",
    [
        "data = bytearray(1024 * 1024 * 1024)",
        "data = []\n            while True:\n                data.append(' ' * 10_000_000)",
    ],
)
def test_it_stops_python_memory_exhaustion(config, body):
    code = f"""
        def evaluate(inputs, outputs, trace):
            {body}
            return "allocated"
    """
    result = one(config, "python", code, project=fresh_project())
    assert error_code(result) == "memory_limit"
    assert_pool_still_works(config, "python")


def test_it_stops_node_memory_exhaustion(config):
    code = """
        function evaluate() {
          const hog = [];
          while (true) hog.push(new Array(1e6).fill(Math.random()));
        }
    """
    project = fresh_project()
    result = one(config, "javascript", code, project=project, timeout_s=30)
    assert error_code(result) == "memory_limit"
    assert_pool_still_works(config, "javascript", project)


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        ("python", "def evaluate(i, o, t):\n    while True:\n        pass\n"),
        (
            "python",
            "import signal\ndef evaluate(i, o, t):\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    while True:\n        pass\n",
        ),
        ("python", "import time\ndef evaluate(i, o, t):\n    time.sleep(10**6)\n"),
        ("javascript", "function evaluate() { while (true) {} }"),
        ("javascript", "process.on('SIGTERM', () => {});\nfunction evaluate() { for (;;) {} }"),
        ("javascript", "async function evaluate() { await new Promise(() => {}); }"),
        (
            "typescript",
            "async function evaluate(): Promise<void> { await new Promise((r) => setTimeout(r, 1e7)); }",
        ),
    ],
)
def test_it_stops_calls_that_never_end(config, runtime, code):
    started = time.monotonic()
    result = one(config, runtime, code, timeout_s=0.5)
    assert error_code(result) == "timeout"
    assert time.monotonic() - started < 5
    assert_pool_still_works(config, "python" if runtime == "python" else "javascript")


def test_it_limits_the_size_of_a_file(config):
    code = """
        def evaluate(inputs, outputs, trace):
            with open("/tmp/huge", "wb") as f:
                while True:
                    f.write(b"x" * 65536)
    """
    result = one(config, "python", code)
    assert error_code(result) == "file_size_limit"
    assert_pool_still_works(config, "python")


def test_it_limits_what_fits_in_tmp(config):
    code = """
        def evaluate(inputs, outputs, trace):
            for n in range(1000):
                with open(f"/tmp/fill-{n}", "wb") as f:
                    f.write(b"x" * 512 * 1024)
    """
    result = one(config, "python", code)
    assert result.error["type"] == "OSError"
    assert "No space left" in result.error["message"]


def test_it_limits_file_size_in_node_without_killing_the_worker(config):
    code = """
        const fs = require('fs');
        function evaluate() { fs.writeFileSync('/tmp/huge', Buffer.alloc(4 * 1024 * 1024)); }
    """
    result = one(config, "javascript", code)
    assert error_code(result) == "exception"
    assert "EFBIG" in result.error["message"]


@pytest.mark.parametrize(
    ("runtime", "code"),
    [
        (
            "python",
            "import os\ndef evaluate(i, o, t):\n    for _ in range(20000):\n"
            "        os.write(1, b'x' * 1000)\n        os.write(2, b'y' * 1000)\n    return 'done'\n",
        ),
        (
            "javascript",
            "const fs = require('fs');\nfunction evaluate() {\n"
            "  for (let n = 0; n < 20000; n++) fs.writeSync(1, 'x'.repeat(1000));\n  return 'done';\n}",
        ),
    ],
)
def test_it_survives_a_flood_on_the_raw_stdout(config, runtime, code):
    assert one(config, runtime, code).value == "done"


def test_it_rejects_a_result_over_the_size_limit(config):
    code = "def evaluate(i, o, t):\n    return 'x' * 2_000_000\n"
    assert error_code(one(config, "python", code)) == "output_limit"


# -- the result channel -------------------------------------------------------------------------
FORGE_EVERY_FD = """
    import json, os
    def evaluate(inputs, outputs, trace):
        if inputs.get("forge"):
            for fd in range(1024):  # the result channel keeps its host fd number
                for index in range(4):
                    frame = "R 0000 %d %s\\n" % (index, json.dumps({"ok": True, "value": "FORGED"}))
                    try:
                        os.write(fd, ("L 0000 {\\"ok\\":true}\\n" + frame).encode())
                    except OSError:
                        pass
        return inputs["n"]
"""


def test_it_never_takes_a_forged_frame_for_a_result(config):
    calls = [call({"n": 0}), call({"n": 1, "forge": True}), call({"n": 2}), call({"n": 3})]
    results = run(config, "python", FORGE_EVERY_FD, calls)
    assert results[0].value == 0
    assert error_code(results[1]) == "protocol_violation"
    assert [r.value for r in results[2:]] == [2, 3]
    assert "FORGED" not in repr(results)


STEAL_THE_NONCE = """
    import gc, json, os
    def evaluate(inputs, outputs, trace):
        if inputs.get("forge"):
            # Find this batch's nonce in the harness's own frames, then forge the *next* result.
            import sys
            frame = sys._getframe()
            while frame and "header" not in frame.f_locals:
                frame = frame.f_back
            nonce = frame.f_locals["header"]["nonce"]
            forged = "R %s %d %s\\n" % (nonce, inputs["n"] + 1, json.dumps({"ok": True, "value": "FORGED"}))
            for fd in range(1024):  # the result channel keeps its host fd number
                try:
                    os.write(fd, forged.encode())
                except OSError:
                    pass
        return inputs["n"]
"""


def test_it_never_lets_a_forged_frame_become_another_calls_result(config):
    calls = [call({"n": 0}), call({"n": 1, "forge": True}), call({"n": 2}), call({"n": 3})]
    results = run(config, "python", STEAL_THE_NONCE, calls)
    assert results[0].value == 0
    assert error_code(results[1]) == "protocol_violation"
    assert [r.value for r in results[2:]] == [2, 3]


def test_it_keeps_forged_frames_away_from_another_evaluator(config):
    project = fresh_project()
    forger = run(config, "python", FORGE_EVERY_FD, [call({"n": 0, "forge": True})], project=project)
    assert error_code(forger[0]) == "protocol_violation"
    honest = run(
        config,
        "python",
        "def evaluate(i, o, t):\n    return i['n'] * 10\n",
        [call({"n": n}) for n in range(3)],
        project=project,
    )
    assert [r.value for r in honest] == [0, 10, 20]


def test_it_keeps_forged_frames_from_node_away_from_results(config):
    code = """
        const fs = require('fs');
        function evaluate(inputs) {
          if (inputs.forge) {
            for (let fd = 0; fd < 1024; fd++) {
              try { fs.writeSync(fd, 'R 0000 2 {"ok":true,"value":"FORGED"}\\n'); } catch (e) {}
            }
          }
          return inputs.n;
        }
    """
    calls = [call({"n": 0}), call({"n": 1, "forge": True}), call({"n": 2})]
    results = run(config, "javascript", code, calls)
    assert results[0].value == 0
    # Node's own pipes are among the fds written to: it may die before the host sees the frame.
    assert error_code(results[1]) in {"protocol_violation", "worker_crashed"}
    assert results[2].value == 2


def test_it_bounds_what_one_batch_may_send_back(config):
    thrifty = config.with_(batch_output_limit_bytes=3_000_000)
    code = "def evaluate(i, o, t):\n    return 'x' * 900_000\n"
    results = run(thrifty, "python", code, [call() for _ in range(6)])
    assert [r.status for r in results[:3]] == ["success"] * 3
    assert {error_code(r) for r in results[3:]} == {"output_limit"}
