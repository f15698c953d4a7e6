"""Python worker harness: runs user evaluators, one line of JSON in, one result frame out per call.

Started as ``worker.py RESULT_FD LOG_LIMIT RESULT_LIMIT RUNTIME`` (inside the jail, or bare for
the ``inprocess`` runner). Wire protocol, all lines are UTF-8 JSON or start with a tag:

host -> worker (stdin)
    {"op": "batch", "nonce": N, "rev": R, "code": C, "version": "1"|"2", "n": K,
     "entry": "evaluate"|"session"}
    then lines, each a JSON array of calls, K calls in all; a call is the list of its
    arguments (v2: inputs, outputs, trace; v1: app_params, inputs, output, correct_answer;
    entry "session": inputs, outputs, session, passed to ``evaluate_session``)
    {"op": "check", "nonce": N, "code": C, "version": "1"|"2"}
    (a check loads the module once; version "1" requires ``evaluate``, "2" either entry point)

worker -> host (RESULT_FD)
    ``H {"runtime": ...}``                  once, when ready
    ``K <nonce>``                           before compiling and running the module (a revision
                                            this worker does not hold yet)
    ``L <nonce> {"ok": true, "logs": ...}`` after loading the batch's evaluator (or its error);
                                            for a revision already held, in the same write as
                                            the first result (one wake-up of the host, not two)
    ``R <nonce> <index> {...}``             one per call (index counts from 0 in the batch), in
                                            order, written as soon as the call ends
    ``C <nonce> [problems]``                answer to a check

A call result is ``{"ok": true, "value": v}``, ``{"ok": true, "unrepresentable": what}`` or
``{"ok": false, "error": {code, type, message, stacktrace}}``, plus ``ms`` and, when the call
printed anything, ``logs``. ``"retire": true`` asks the host to replace this worker.

The harness is not a security boundary (user code runs in this very process and can reach
everything here); the jail around it is. It only keeps honest mistakes apart and makes every
frame traceable to one call of one batch.
"""

import gc
import json
import math
import os
import signal
import sys
import time
import traceback
import types

_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode
_loads = json.loads
_encode_str = json.encoder.encode_basestring_ascii
_perf = time.perf_counter
_write = os.write
_SCALARS = (str, int, bool, type(None))
_FILENAME = "evaluator.py"
MAX_EVALUATORS = 64  # compiled revisions kept per worker, oldest dropped first


def _run_coroutine(coroutine):
    """``async def evaluate``: run it to completion on a fresh event loop."""
    import asyncio  # only async evaluators pay for the import

    return asyncio.run(coroutine)


class Capture:
    """sys.stdout / sys.stderr for user code: keeps the first ``limit`` characters of a call."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list = []
        self.size = 0
        self.truncated = False

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.size
        if room <= 0:
            self.truncated = self.truncated or bool(text)
            return len(text)
        if len(text) > room:
            self.truncated = True
            text = text[:room]
        self.parts.append(text)
        self.size += len(text)
        return len(text)

    def take(self) -> str:
        text = "".join(self.parts)
        if self.truncated:
            text += f"\n[output truncated after {self.limit} characters]"
        self.parts, self.size, self.truncated = [], 0, False
        return text

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return "utf-8"


class Evaluator:
    def __init__(self, filename: str, code: str) -> None:
        self.filename = filename
        self.code = code
        self.lines = code.splitlines()
        self.module = types.ModuleType("evaluator")
        self.namespace = self.module.__dict__
        self.function = None
        self.session_function = None

    def entry(self, name: str):
        """The function a batch calls: ``evaluate``, or ``evaluate_session`` for sessions."""
        return self.session_function if name == "session" else self.function


class Harness:
    def __init__(self, result_fd: int, log_limit: int, result_limit: int) -> None:
        self.out = result_fd
        self.result_limit = result_limit
        self.capture = Capture(log_limit)
        self.evaluators: dict = {}  # revision key -> Evaluator, oldest first
        self.loaded = 0
        self.requests = os.fdopen(0, "rb", buffering=1 << 16)

    # -- frames ---------------------------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        view = memoryview(frame)
        while view:
            view = view[_write(self.out, view) :]

    def serve(self) -> None:
        self.send(b'H {"runtime":"python %d.%d.%d"}\n' % sys.version_info[:3])
        for line in self.requests:
            message = _loads(line)
            if message["op"] == "batch":
                self.batch(message)
            elif message["op"] == "check":
                self.check(message)

    # -- loading --------------------------------------------------------------------------------
    def load(self, rev: str, code: str, nonce: bytes) -> tuple:
        """Compile and run the module once per revision; returns (evaluator, error dict,
        whether it was compiled now)."""
        cached = self.evaluators.get(rev)
        if cached is not None and cached.code == code:
            return cached, None, False
        # Running the module may take long: the host then blames a fault on the load.
        self.send(b"K %s\n" % nonce)
        self.loaded += 1
        evaluator = Evaluator(f"<evaluator {self.loaded}>", code)
        error = self.run_module(evaluator, code)
        if error is None:
            self.evaluators.pop(rev, None)
            self.evaluators[rev] = evaluator
            if len(self.evaluators) > MAX_EVALUATORS:
                del self.evaluators[next(iter(self.evaluators))]
        return evaluator, error, True

    def run_module(self, evaluator: Evaluator, code: str):
        try:
            compiled = compile(code, evaluator.filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
            return self.compile_error(exc)
        # Registered while it runs: dataclasses and typing look a class's module up by name.
        sys.modules["evaluator"] = evaluator.module
        try:
            exec(compiled, evaluator.namespace)  # noqa: S102 - running user code is the point
        except BaseException as exc:
            error = self.error_of(exc, evaluator)
            error["code"] = "memory_limit" if isinstance(exc, MemoryError) else "compile_error"
            line = last_user_line(exc, evaluator)
            if line:
                error["line"] = line
            return error
        function = evaluator.namespace.get("evaluate")
        session_function = evaluator.namespace.get("evaluate_session")
        if not callable(function) and not callable(session_function):
            return {
                "code": "compile_error",
                "type": "MissingEvaluate",
                "message": "The code does not define an evaluate() function (nor "
                "evaluate_session(inputs, outputs, session), for sessions).",
                "stacktrace": "",
            }
        evaluator.function = function if callable(function) else None
        evaluator.session_function = session_function if callable(session_function) else None
        return None

    def compile_error(self, exc: BaseException) -> dict:
        line = getattr(exc, "lineno", None)
        message = getattr(exc, "msg", None) or str(exc)
        error = {
            "code": "compile_error",
            "type": type(exc).__name__,
            "message": f"{message} (line {line})" if line else message,
            "stacktrace": "".join(traceback.format_exception_only(type(exc), exc)).replace(
                f'"{exc.filename}"' if getattr(exc, "filename", None) else "\0", f'"{_FILENAME}"'
            ),
        }
        if line:
            error["line"] = line
            offset = getattr(exc, "offset", None)
            if offset:
                error["column"] = offset
        return error

    # -- batches --------------------------------------------------------------------------------
    def batch(self, header: dict) -> None:
        nonce = header["nonce"].encode()
        remaining = header["n"]
        self.reset_process_state()
        evaluator, error, compiled = self.load(header["rev"], header["code"], nonce)
        entry = header.get("entry") or "evaluate"
        function = evaluator.entry(entry) if error is None else None
        if error is None and function is None:
            error = missing_entry(entry, header.get("version"))
        loaded = {"ok": error is None}
        if error is not None:
            loaded["error"] = error
        logs = self.capture.take()
        if logs:
            loaded["logs"] = logs
        ahead = b"L %s %s\n" % (nonce, _dumps(loaded).encode())
        if compiled or error is not None:
            # The host restarts the first call's clock on this frame.
            self.send(ahead)
            ahead = b""
        index = 0
        while remaining > 0:
            chunk = _loads(self.requests.readline())
            remaining -= len(chunk)
            if error is None and chunk:
                index = self.run_chunk(
                    evaluator, function, chunk, b"R " + nonce + b" ", index, ahead
                )
                ahead = b""
        if ahead:
            self.send(ahead)

    def run_chunk(
        self, evaluator: Evaluator, function, chunk: list, prefix: bytes, index: int, ahead: bytes
    ) -> int:
        """Run each call of a chunk, sending its frame before starting the next one. ``ahead``
        (a deferred ``L`` frame) goes out with the first: one write, one wake-up of the host."""
        call, out = self.call, self.out
        for args in chunk:
            encoded, retire = call(function, evaluator, args)
            frame = b"%s%s%d %s\n" % (ahead, prefix, index, encoded)
            ahead = b""
            written = _write(out, frame)
            if written != len(frame):
                self.send(frame[written:])
            if retire:
                os._exit(0)
            index += 1
        return index

    def call(self, function, evaluator: Evaluator, args: list) -> tuple:
        """Run one call; returns (the encoded result, whether to retire this worker)."""
        started = _perf()
        try:
            value = function(*args)
            if type(value) is types.CoroutineType:
                value = _run_coroutine(value)
        except BaseException as exc:
            ms = (_perf() - started) * 1000
            fields = '"ok":false,"error":' + _dumps(self.error_of(exc, evaluator))
            retire = isinstance(exc, MemoryError)
        else:
            ms = (_perf() - started) * 1000
            fields = self.encode_value(value)
            retire = False
        capture = self.capture
        logs = ',"logs":' + _dumps(capture.take()) if capture.parts or capture.truncated else ""
        # A MemoryError leaves the process in doubt: report it, then ask to be replaced.
        tail = ',"retire":true' if retire else ""
        return f'{{"ms":{ms:.4f},{fields}{logs}{tail}}}'.encode(), retire

    def encode_value(self, value) -> str:
        """The JSON fields (without braces) reporting a returned value."""
        kind = type(value)
        if kind is bool:
            return '"ok":true,"value":true' if value else '"ok":true,"value":false'
        if kind is str and len(value) < 4096:
            return '"ok":true,"value":' + _encode_str(value)
        if kind is int or (kind is float and math.isfinite(value)):
            return '"ok":true,"value":' + repr(value)
        try:
            what = describe_unrepresentable(value)
            encoded = None if what else _dumps(value)
        except (ValueError, TypeError, RecursionError) as exc:
            what = f"a value JSON cannot carry ({exc})"
        if what:
            return '"ok":true,"unrepresentable":' + _dumps(what)
        if len(encoded) > self.result_limit:
            error = {
                "code": "output_limit",
                "type": "OutputLimit",
                "message": f"evaluate() returned {len(encoded)} bytes of JSON; "
                f"the limit is {self.result_limit}.",
                "stacktrace": "",
            }
            return '"ok":false,"error":' + _dumps(error)
        return '"ok":true,"value":' + encoded

    def error_of(self, exc: BaseException, evaluator: Evaluator) -> dict:
        code = "memory_limit" if isinstance(exc, MemoryError) else "exception"
        try:
            message = str(exc)
        except BaseException:
            message = f"<{type(exc).__name__} with an unprintable message>"
        if isinstance(exc, SystemExit):
            message = f"evaluate() called exit({message})"
        if isinstance(exc, OSError) and exc.errno == 27:  # EFBIG from RLIMIT_FSIZE
            code = "file_size_limit"
        return {
            "code": code,
            "type": type(exc).__name__,
            "message": message,
            "stacktrace": format_user_traceback(exc, evaluator),
        }

    def reset_process_state(self) -> None:
        """Undo what one evaluator could leave running into the next batch (best effort)."""
        sys.settrace(None)
        sys.setprofile(None)
        gc.callbacks.clear()
        for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
            signal.setitimer(timer, 0)
        sys.stdout = sys.stderr = self.capture

    # -- checks ---------------------------------------------------------------------------------
    def check(self, message: dict) -> None:
        self.reset_process_state()
        evaluator = Evaluator("<evaluator check>", message["code"])
        error = self.run_module(evaluator, message["code"])
        if error is None and message.get("version") == "1" and evaluator.function is None:
            error = missing_entry("evaluate", "1")
        self.capture.take()
        problems = [] if error is None else [error]
        self.send(b"C %s %s\n" % (message["nonce"].encode(), _dumps(problems).encode()))


def missing_entry(entry: str, version=None) -> dict:
    """The load error of a batch (or check) whose entry point the module does not define."""
    if entry == "session":
        return {
            "code": "session_unsupported",
            "type": "MissingEvaluateSession",
            "message": "The code does not define evaluate_session(inputs, outputs, session), so "
            "it cannot judge sessions. Define it beside evaluate().",
            "stacktrace": "",
        }
    if version == "1":
        return {
            "code": "compile_error",
            "type": "MissingEvaluate",
            "message": "Interface version 1 calls evaluate(app_params, inputs, output, "
            "correct_answer), which the code does not define (evaluate_session judges sessions, "
            "with interface version 2 only).",
            "stacktrace": "",
        }
    return {
        "code": "compile_error",
        "type": "MissingEvaluate",
        "message": "The code does not define an evaluate() function (it defines only "
        "evaluate_session, which judges sessions).",
        "stacktrace": "",
    }


def describe_unrepresentable(value, path: str = ""):
    """What JSON cannot carry in ``value``, described for a user, or None if it is fine."""
    kind = type(value)
    if kind in _SCALARS:
        return None
    if kind is float or isinstance(value, float):
        if math.isfinite(value):
            return None
        return _at(_float_name(value), path)
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                what = f"a non-string key {key!r}"
                return f"{what} in {path}" if path else f"a dict containing {what}"
            found = describe_unrepresentable(item, f"{path}.{key}" if path else key)
            if found:
                return found if path else f"a dict containing {found}"
        return None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = describe_unrepresentable(item, f"{path}[{index}]")
            if found:
                return found if path else f"a list containing {found}"
        return None
    if isinstance(value, _SCALARS):
        return None
    return _at(_type_name(value), path)


def _at(what: str, path: str) -> str:
    return f"{what} at {path}" if path else what


def _float_name(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _type_name(value) -> str:
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def last_user_line(exc: BaseException, evaluator: Evaluator):
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == evaluator.filename:
            line = lineno
    return line


def format_user_traceback(exc: BaseException, evaluator: Evaluator) -> str:
    """A traceback with the harness's own frames removed and the user's lines shown."""
    frames = []
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if filename == __file__:
            continue
        if filename == evaluator.filename:
            source = ""
            if 0 < lineno <= len(evaluator.lines):
                source = evaluator.lines[lineno - 1].strip()
            frames.append(f'  File "{_FILENAME}", line {lineno}, in {frame.f_code.co_name}\n')
            if source:
                frames.append(f"    {source}\n")
        else:
            summary = traceback.FrameSummary(filename, lineno, frame.f_code.co_name)
            frames.extend(traceback.format_list([summary]))
    head = "Traceback (most recent call last):\n" if frames else ""
    tail = "".join(traceback.format_exception_only(type(exc), exc))
    return head + "".join(frames) + tail


def main() -> None:
    result_fd, log_limit, result_limit = (int(a) for a in sys.argv[1:4])
    # SIGINT/SIGTERM from the host mean "stop": no KeyboardInterrupt handling inside user code.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    harness = Harness(result_fd, log_limit, result_limit)
    sys.stdin = open(os.devnull)  # noqa: SIM115 - input() must not read the request pipe
    sys.stdout = sys.stderr = harness.capture
    harness.serve()


if __name__ == "__main__":
    main()
