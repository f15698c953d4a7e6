"""Run one script in the code sandbox: bytes on stdin in; stdout, stderr and exit code out.

Public API (used by script prompt templates of the ``llm_judge`` kind)::

    run_script(runtime=..., code=..., stdin=b"...", timeout_s=10.0,
               modules={"name": "source"}, preload=[("name", "attr")]) -> ScriptResult

Unlike ``run_batch`` (warm workers, one ``evaluate()`` call per item) this starts a fresh process
per script, because a script owns its whole process: it reads stdin to the end, prints, exits.
It uses the same jail as the workers (``jail.py``: namespaces, read-only root holding only the
interpreter, empty environment, seccomp filter, rlimits) and the same runner setting:
``EVALSITE_CODE_RUNNER=sandbox`` jails it, ``inprocess`` runs it bare, anything else raises
``SandboxUnavailable``.

The script's own stdin is exactly the ``stdin`` bytes. Its code, and small helper modules it may
import (``modules``, Python modules or CommonJS modules by name), reach the harness ahead of
them on the same pipe as one length-prefixed JSON frame that the harness consumes before the
script starts. ``preload`` also binds ``module.attr`` as a global of the script, so helpers work
without an import. TypeScript and ES-module JavaScript are transpiled with sucrase, as in the
workers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from . import jail
from .config import RUNTIMES, Config, load_config
from .errors import SandboxError, SandboxUnavailable
from .seccomp import filter_bpf

STDERR_TAIL = 8192
_READ = 1 << 16

_PYTHON_HARNESS = r"""
import builtins, json, linecache, os, sys, traceback, types

def _read(n):
    parts = []
    while n > 0:
        chunk = os.read(0, n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)

def _length():
    digits = b""
    while True:
        c = os.read(0, 1)
        if not c or c == b"\n":
            return int(digits or b"0")
        digits += c

_frame = json.loads(_read(_length()))
for _name, _source in _frame["modules"].items():
    _module = types.ModuleType(_name)
    _module.__file__ = _name + ".py"
    sys.modules[_name] = _module
    exec(compile(_source, _name + ".py", "exec"), _module.__dict__)
_file = _frame["filename"]
linecache.cache[_file] = (len(_frame["code"]), None, _frame["code"].splitlines(True), _file)
_globals = {"__name__": "__main__", "__file__": _file, "__builtins__": builtins}
for _name, _attr in _frame["preload"]:
    _globals[_attr] = getattr(sys.modules[_name], _attr)
try:
    exec(compile(_frame["code"], _file, "exec"), _globals)
except SystemExit:
    raise
except BaseException as _error:
    _tb = traceback.TracebackException.from_exception(_error)
    _tb.stack = traceback.StackSummary.from_list(
        [f for f in _tb.stack if f.filename != "<string>"]
    )
    sys.stdout.flush()
    sys.stderr.write("".join(_tb.format()))
    sys.stderr.flush()
    os._exit(1)
"""

_NODE_HARNESS = r"""
'use strict';
const fs = require('fs');
const vm = require('vm');
const { createRequire } = require('module');
const [runtime, requireBase] = process.argv.slice(1, 3);

function readSome(buffer, offset, length) {
  for (;;) {
    try {
      return fs.readSync(0, buffer, offset, length, null);
    } catch (error) {
      if (error.code === 'EAGAIN') continue;
      if (error.code === 'EOF') return 0;
      throw error;
    }
  }
}
function readLength() {
  const one = Buffer.alloc(1);
  let digits = '';
  while (readSome(one, 0, 1) === 1 && one[0] !== 10) digits += String.fromCharCode(one[0]);
  return Number(digits || 0);
}
function readExact(n) {
  const buffer = Buffer.alloc(n);
  let offset = 0;
  while (offset < n) {
    const read = readSome(buffer, offset, n - offset);
    if (read === 0) break;
    offset += read;
  }
  return buffer.subarray(0, offset).toString('utf8');
}

const frame = JSON.parse(readExact(readLength()));
const baseRequire = createRequire(requireBase);
let sucrase = null;
function transpile(code, typescript, filename) {
  if (!typescript && !/\b(import|export)\b/.test(code)) return code;
  if (sucrase === null) sucrase = baseRequire('sucrase');
  const transforms = typescript ? ['typescript', 'imports'] : ['imports'];
  return sucrase.transform(code, { transforms, filePath: filename }).code;
}
const loaded = new Map();
function userRequire(name) {
  if (Object.prototype.hasOwnProperty.call(frame.modules, name)) {
    if (!loaded.has(name)) loaded.set(name, run(frame.modules[name], name + '.js', false));
    return loaded.get(name);
  }
  return baseRequire(name);
}
function run(code, filename, typescript) {
  const module = { exports: {} };
  const body = vm.compileFunction(
    transpile(code, typescript, filename),
    ['exports', 'require', 'module', '__filename', '__dirname'],
    { filename },
  );
  body(module.exports, userRequire, module, filename, '/');
  return module.exports;
}
try {
  for (const [name, attr] of frame.preload) globalThis[attr] = userRequire(name)[attr];
  run(frame.code, frame.filename, runtime === 'typescript');
} catch (error) {
  // The harness's own frames say nothing to the script's author.
  const stack = String((error && error.stack) || error).split('\n');
  fs.writeSync(2, stack.filter((line) => !/\[eval\]|node:internal/.test(line)).join('\n') + '\n');
  process.exit(1);
}
"""


@dataclass
class ScriptResult:
    """How a script ended.

    ``exit_code`` is the process's exit status (``None`` when evalsite stopped it: see
    ``fault``, ``timeout`` or ``output_limit``). ``stdout`` is everything it printed (decoded as
    UTF-8), ``stderr`` the last ``STDERR_TAIL`` characters of its error output.
    """

    exit_code: int | None
    stdout: str
    stderr: str
    duration_ms: float
    fault: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.fault


def run_script(
    *,
    runtime: str,
    code: str,
    stdin: bytes | str = b"",
    timeout_s: float = 10.0,
    modules: dict[str, str] | None = None,
    preload: list[tuple[str, str]] | None = None,
    filename: str = "",
) -> ScriptResult:
    """Run ``code`` once with ``stdin``; failures of the script are results, never exceptions.

    Raises ``SandboxUnavailable`` only when the configured runner cannot run scripts here.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    config = load_config()
    if config.runner not in ("sandbox", "inprocess"):
        raise SandboxUnavailable(
            f"scripts run with EVALSITE_CODE_RUNNER=sandbox or inprocess, not {config.runner!r}."
        )
    frame = json.dumps(
        {
            "code": code,
            "filename": filename or _default_filename(runtime),
            "modules": modules or {},
            "preload": [list(p) for p in preload or []],
        }
    ).encode()
    data = stdin.encode() if isinstance(stdin, str) else stdin
    feed = b"%d\n" % len(frame) + frame + data
    # The CPU rlimit is a backstop behind the wall clock, as for the workers.
    config = config.with_(cpu_seconds=max(1, math.ceil(timeout_s) + 1))
    return _Run(config, runtime, sandboxed=config.runner == "sandbox").communicate(feed, timeout_s)


def _default_filename(runtime: str) -> str:
    return {"python": "script.py", "javascript": "script.js", "typescript": "script.ts"}[runtime]


class _Run:
    """One started script process and the host ends of its three pipes."""

    def __init__(self, config: Config, runtime: str, *, sandboxed: bool) -> None:
        self.config = config
        self.started = time.perf_counter()
        self.pidfd = -1
        if sandboxed:
            self.proc = self._start_jailed(runtime)
        else:
            self.proc = self._start_bare(runtime)

    def _command(self, runtime: str, base: tuple[str, ...]) -> list[str]:
        if jail.family(runtime) == "python":
            return [base[0], "-I", "-S", "-B", "-X", "utf8", "-c", _PYTHON_HARNESS]
        # base[-1] is where the workers' harness sits: sucrase resolves from beside it.
        return [base[0], *jail.node_flags(self.config), "-e", _NODE_HARNESS, runtime, base[-1]]

    def _start_jailed(self, runtime: str) -> subprocess.Popen[bytes]:
        config = self.config
        if not os.access(config.bwrap, os.X_OK):
            raise SandboxUnavailable(f"bwrap not found at {config.bwrap}")
        layout = jail.layout_for(config, runtime)
        bpf_r, bpf_w = os.pipe2(os.O_CLOEXEC)
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(bpf_w, filter_bpf(allow_threads=jail.family(runtime) == "node"))
            os.close(bpf_w)
            bpf_w = -1
            argv = jail.limits_prefix(config, runtime) + jail.bwrap_argv(
                config,
                layout,
                self._command(runtime, layout.argv),
                seccomp_fd=bpf_r,
                info_fd=info_w,
            )
            uid = jail.sandbox_uid(config, runtime)
            as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(bpf_r, info_w),
                env={},
                **as_user,
            )
            os.close(info_w)
            info_w = -1
            pid = jail.read_child_pid(info_r, proc, config.start_timeout_s)
        finally:
            for fd in (bpf_r, bpf_w, info_r, info_w):
                if fd >= 0:
                    os.close(fd)
        try:
            self.pidfd = os.pidfd_open(pid)
        except OSError:
            self.pidfd = -1  # it already ended; its pipes will say so
        return proc

    def _start_bare(self, runtime: str) -> subprocess.Popen[bytes]:
        layout = jail.layout_for(self.config, runtime)
        argv = jail.limits_prefix(self.config, runtime) + self._command(runtime, layout.bare_argv)
        return subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"LANG": "C.UTF-8", "TZ": "UTC"},
        )

    def communicate(self, feed: bytes, timeout_s: float) -> ScriptResult:
        out, err = bytearray(), bytearray()
        limit = self.config.result_limit_bytes
        deadline = self.started + timeout_s
        try:
            fault = self._pump(feed, out, err, deadline, limit) or self._await_exit(deadline)
        finally:
            exit_code = self._stop()
        messages = {
            "timeout": f"the script did not finish within {timeout_s:g} s and was stopped.",
            "output_limit": f"the script printed more than {limit} bytes and was stopped.",
        }
        return ScriptResult(
            exit_code=None if fault else exit_code,
            stdout=bytes(out[:limit]).decode("utf-8", "replace"),
            stderr=bytes(err).decode("utf-8", "replace")[-STDERR_TAIL:],
            duration_ms=round((time.perf_counter() - self.started) * 1000, 3),
            fault=fault,
            message=messages.get(fault, ""),
        )

    def _pump(
        self, feed: bytes, out: bytearray, err: bytearray, deadline: float, limit: int
    ) -> str:
        """Feed stdin and drain stdout/stderr until all three close; returns a fault or ""."""
        proc = self.proc
        assert proc.stdin and proc.stdout and proc.stderr
        selector = selectors.DefaultSelector()
        pending = memoryview(feed)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        if pending:
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        selector.register(proc.stdout, selectors.EVENT_READ, out)
        selector.register(proc.stderr, selectors.EVENT_READ, err)
        try:
            while selector.get_map():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    return "timeout"
                for key, _ in selector.select(remaining):
                    if key.fileobj is proc.stdin:
                        pending = self._write(selector, pending)
                        continue
                    chunk = os.read(key.fd, _READ)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        continue
                    key.data.extend(chunk)
                    if key.data is out and len(out) > limit:
                        return "output_limit"
                    if key.data is err and len(err) > 2 * STDERR_TAIL:
                        del err[:-STDERR_TAIL]
        finally:
            selector.close()
        return ""

    def _await_exit(self, deadline: float) -> str:
        """Its pipes are closed; give it until the deadline to exit."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            return "timeout"
        return ""

    def _write(self, selector: selectors.BaseSelector, pending: memoryview) -> memoryview:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            pending = pending[os.write(stdin.fileno(), pending[:_READ]) :]
        except BlockingIOError:
            return pending
        except (BrokenPipeError, ConnectionResetError):
            pending = pending[len(pending) :]  # the script stopped reading; that is its right
        if not pending:
            selector.unregister(stdin)
            stdin.close()
        return pending

    def _stop(self) -> int:
        """Kill whatever is left (the script first, through its pidfd, then bwrap), reap it,
        close the pipes; returns the exit status."""
        if self.proc.poll() is None:
            if self.pidfd >= 0:
                with contextlib.suppress(OSError):  # it has just exited
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            self.proc.kill()
        try:
            status = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise SandboxError("a script process could not be stopped") from None
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()
            if self.pidfd >= 0:
                os.close(self.pidfd)
                self.pidfd = -1
        return status
