"""Starting one worker process: inside bubblewrap + seccomp (``sandbox``) or bare (``inprocess``).

The jail (see docs/sandbox.md for the threat model):

- namespaces: user, pid (the worker is pid 1), net (empty: not even loopback is up), ipc, uts,
  cgroup; ``--disable-userns`` so the worker cannot nest a namespace of its own;
- a root that exists only in memory and is read-only, holding the interpreter, its standard
  library (never site-packages), the shared libraries they link, the harness, and for Node the
  few packages sucrase needs; a fresh ``/proc`` of the pid namespace, a minimal ``/dev``, and a
  size-limited tmpfs on ``/tmp``;
- an empty environment, a new session (no terminal to inject into), ``--die-with-parent``;
- the seccomp filter from ``seccomp.py``;
- rlimits set by ``prlimit(1)`` on the way in, before bwrap starts, soft = hard.
- as root, bwrap itself runs as an unprivileged host uid (``uid_decision``), binding a copy of
  the harness that uid can read when the checkout is out of its reach (``staging.py``); a jail
  that would keep host root refuses to start unless ``EVALSITE_SANDBOX_ALLOW_ROOT``.

File descriptors: 0 carries requests in, 3 carries result frames out, 1 and 2 go to a host pipe
that is drained and kept only as a bounded tail for diagnosing a crash (user output is captured by
the harness itself, per call).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import select
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from . import staging
from .config import PACKAGE_DIR, Config, data_dir
from .errors import SandboxError, SandboxUnavailable
from .seccomp import filter_bpf

log = logging.getLogger("evaluators.sandbox")

HARNESS_DIR = PACKAGE_DIR / "harness"
_PY_HOME = "/opt/python"
_HARNESS_HOME = "/opt/evalsite"
_LIB_DIR = "/usr/lib"
_NOBODY = 65534
# Extension modules an evaluator has no use for, whose libraries (X11, Tk, curses) we would
# otherwise have to bind.
_SKIPPED_EXTENSIONS = re.compile(r"^(_tkinter|_curses|_curses_panel|readline|nis|_dbm|_gdbm)\.")


@dataclass(frozen=True)
class Bind:
    host: str
    inside: str


@dataclass(frozen=True)
class Layout:
    """What one runtime needs inside the jail, and how to start it."""

    binds: tuple[Bind, ...]
    masks: tuple[str, ...]  # directories hidden under an empty read-only tmpfs
    argv: tuple[str, ...]  # the command inside the jail
    bare_argv: tuple[str, ...]  # the same command for the unsandboxed runner


@dataclass
class Spawned:
    """A started worker: its processes and the host ends of its pipes."""

    proc: subprocess.Popen[bytes]
    pid: int  # host pid of the harness itself (inside bwrap: the jail's pid 1)
    pidfd: int
    requests: int  # write end: host -> worker
    results: int  # read end: worker -> host
    diag: int  # read end: the worker's stdout + stderr


def family(runtime: str) -> str:
    return "python" if runtime == "python" else "node"


# (configuration, runtime family) pairs whose jail passed the per-call check
# (``sandbox._require_sandbox``): it is then a set lookup, until ``forget_resolutions``.
checked: set[tuple[Config, str]] = set()
# Runtime families that started a worker since ``forget_resolutions`` last ran.
_working: set[str] = set()


def forget_resolutions(runtime: str) -> bool:
    """Drop every path resolved once per process (layouts, uid decisions, readability, staged
    files, the per-call check), after a worker failed to start: the next start resolves them
    afresh. True when ``runtime``'s had started a worker before: they went stale, so starting
    again is worth a try; False when they never worked, so the failure stands."""
    proven = family(runtime) in _working
    _working.clear()
    checked.clear()
    for cached in (_python_layout, _node_layout, _uid_decision, _readable_by, _runtime_files):
        cached.cache_clear()
    return proven


def mark_working(runtime: str) -> None:
    """A worker of ``runtime`` started (said hello) with the current resolutions."""
    _working.add(family(runtime))


def python_layout(config: Config) -> Layout:
    # Keyed by the interpreter's real path: a symlink pointed elsewhere is a new layout.
    return _python_layout(os.path.realpath(config.python), runtime_files(config).harness)


def node_layout(config: Config) -> Layout:
    files = runtime_files(config)
    return _node_layout(os.path.realpath(config.node), files.harness, files.node_modules)


@functools.cache
def _python_layout(python: str, harness: str) -> Layout:
    stdlib = _stdlib_of(python)
    version = Path(stdlib).name  # "python3.11"
    inside_bin = f"{_PY_HOME}/bin/{version}"
    inside_stdlib = f"{_PY_HOME}/lib/{version}"
    extensions = [
        str(p)
        for p in Path(stdlib, "lib-dynload").glob("*.so")
        if not _SKIPPED_EXTENSIONS.match(p.name)
    ]
    binds = [
        Bind(python, inside_bin),
        Bind(stdlib, inside_stdlib),
        Bind(f"{harness}/worker.py", f"{_HARNESS_HOME}/worker.py"),
        *_library_binds([python, *extensions]),
    ]
    # -I: no environment, no user site, no cwd on sys.path; -S: skip site (and its .pth files);
    # -B: the root is read-only anyway.
    flags = ("-I", "-S", "-B", "-X", "utf8")
    worker = f"{_HARNESS_HOME}/worker.py"
    return Layout(
        binds=tuple(binds),
        masks=(f"{inside_stdlib}/site-packages",) if Path(stdlib, "site-packages").is_dir() else (),
        argv=(inside_bin, *flags, worker),
        bare_argv=(python, *flags, str(HARNESS_DIR / "worker.py")),
    )


@functools.cache
def _node_layout(node: str, harness: str, node_modules: str) -> Layout:
    binds = [
        Bind(node, "/usr/bin/node"),
        Bind(f"{harness}/worker.js", f"{_HARNESS_HOME}/worker.js"),
        *_library_binds([node]),
    ]
    for package in staging.NODE_PACKAGES:
        source = Path(node_modules, package)
        if source.exists():
            binds.append(Bind(str(source.resolve()), f"{_HARNESS_HOME}/node_modules/{package}"))
    return Layout(
        binds=tuple(binds),
        masks=(),
        argv=("/usr/bin/node", f"{_HARNESS_HOME}/worker.js"),
        bare_argv=(node, str(HARNESS_DIR / "worker.js")),
    )


def _stdlib_of(python: str) -> str:
    if python == os.path.realpath(getattr(sys, "_base_executable", sys.executable)):
        return sysconfig.get_paths()["stdlib"]
    query = "import sysconfig; print(sysconfig.get_paths()['stdlib'])"
    try:
        out = subprocess.run([python, "-I", "-S", "-c", query], capture_output=True, text=True)
    except OSError as exc:
        raise SandboxUnavailable(f"cannot run the sandbox's Python {python}: {exc.strerror}")
    if out.returncode != 0:
        raise SandboxUnavailable(f"cannot run the sandbox's Python {python}: {out.stderr.strip()}")
    return out.stdout.strip()


def _library_binds(binaries: list[str]) -> list[Bind]:
    """Every shared library the binaries link, bound where the dynamic loader will look."""
    try:
        out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise SandboxUnavailable("ldd not found: cannot work out which libraries to bind.")
    binds: dict[str, Bind] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
            binds[parts[0]] = Bind(os.path.realpath(parts[2]), f"{_LIB_DIR}/{parts[0]}")
        elif parts and parts[0].startswith("/") and "ld-linux" in parts[0]:
            # The loader must sit at the exact path written in each binary's PT_INTERP.
            binds[parts[0]] = Bind(os.path.realpath(parts[0]), parts[0])
    return list(binds.values())


def bwrap_argv(
    config: Config, layout: Layout, command: list[str], *, seccomp_fd: int, info_fd: int
) -> list[str]:
    argv = [
        config.bwrap,
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--disable-userns", "--as-pid-1",
        "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
        "--hostname", "sandbox",
        "--setenv", "LANG", "C.UTF-8", "--setenv", "TZ", "UTC",
    ]  # fmt: skip
    for bind in layout.binds:
        argv += ["--ro-bind", bind.host, bind.inside]
    for mask in layout.masks:
        argv += ["--size", "4096", "--tmpfs", mask, "--remount-ro", mask]
    argv += ["--ro-bind-try", "/usr/share/zoneinfo", "/usr/share/zoneinfo"]
    # Read-only /proc: with a host-root uid, sysctl files would otherwise be writable (the kernel
    # checks the uid, not the namespace). Read-only /dev: its tmpfs has no size limit.
    argv += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    # The jail's own /tmp: a fresh, size-limited tmpfs.
    tmp = "/tmp"  # noqa: S108
    argv += ["--size", str(config.tmp_mb * 1024 * 1024), "--perms", "1777", "--tmpfs", tmp]
    argv += ["--remount-ro", "/", "--chdir", tmp]
    argv += ["--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--", *command]
    return argv


def layout_for(config: Config, runtime: str) -> Layout:
    return python_layout(config) if family(runtime) == "python" else node_layout(config)


def sandbox_uid(config: Config, runtime: str) -> int | None:
    """The host uid the jail runs as, or None to keep the caller's.

    Raises ``SandboxUnavailable`` when jailed code would run as host root and that is not
    allowed (``uid_decision``)."""
    uid, problem = uid_decision(config, runtime)
    if problem:
        raise SandboxUnavailable(problem)
    return uid


def uid_decision(config: Config, runtime: str) -> tuple[int | None, str | None]:
    """(the jail's host uid or None to keep the caller's, why it refuses to start or None).

    Only root can switch, and always does: to ``EVALSITE_SANDBOX_UID`` (-1 = 65534), which must
    be able to read every path the jail binds (the harness and node packages are staged where
    it can, ``runtime_files``). When it cannot, or with ``uid=0``, the jail would keep host
    root: refused unless ``EVALSITE_SANDBOX_ALLOW_ROOT``. Decided once per process and
    configuration: the fast path does no file-system work."""
    return _uid_decision(config, family(runtime))


@functools.lru_cache(maxsize=256)
def _uid_decision(config: Config, runtime_family: str) -> tuple[int | None, str | None]:
    if os.geteuid() != 0:
        return None, None
    if config.uid == 0:
        if config.allow_root:
            return None, None
        return None, (
            "EVALSITE_SANDBOX_UID=0 would run jailed code as host root; "
            "set EVALSITE_SANDBOX_ALLOW_ROOT=1 to allow that"
        )
    uid = _NOBODY if config.uid < 0 else config.uid
    layout = python_layout(config) if runtime_family == "python" else node_layout(config)
    unreadable = _first_unreadable(layout, uid)
    if unreadable is None:
        return uid, None
    if config.uid < 0 and config.allow_root:
        return None, None
    return None, _refusal(config, runtime_family, uid, unreadable)


def _refusal(config: Config, runtime_family: str, uid: int, unreadable: Bind) -> str:
    label = "Python" if runtime_family == "python" else "JavaScript/TypeScript"
    if unreadable.inside.startswith(_HARNESS_HOME):  # a file staging should have copied
        note = runtime_files(config).note
        why = f"{unreadable.host}, and copying it where uid {uid} can read it failed: {note}"
        advice = "set EVALSITE_SANDBOX_RUNTIME_DIR to a folder it can reach"
    else:
        setting = (
            "EVALSITE_SANDBOX_PYTHON" if runtime_family == "python" else "EVALSITE_SANDBOX_NODE"
        )
        why = unreadable.host
        advice = (
            f"make it readable by uid {uid} (for an interpreter under /root, set {setting} to a "
            "world-readable one)"
        )
    if config.uid > 0:
        return f"EVALSITE_SANDBOX_UID={uid} cannot read {why}; {advice}"
    return (
        f"{label} code would run as host root: the jail drops to uid {uid} only when that uid "
        f"can read every path it binds, and it cannot read {why}; {advice}, or set "
        "EVALSITE_SANDBOX_ALLOW_ROOT=1 to run it as host root anyway"
    )


def runtime_files(config: Config) -> staging.RuntimeFiles:
    """Where the harness and node packages are bound from: the checkout itself, or a staged
    copy (staging.py) when evalsite runs as root and the jail's uid cannot read the checkout."""
    uid = _NOBODY if config.uid < 0 else config.uid
    return _runtime_files(config.node_modules, config.runtime_dir, data_dir(), uid)


@functools.cache
def _runtime_files(
    node_modules: str, runtime_dir: str, data: str, uid: int
) -> staging.RuntimeFiles:
    here = staging.RuntimeFiles(str(HARNESS_DIR), node_modules)
    if os.geteuid() != 0 or uid == 0:
        return here
    files = staging.sources(HARNESS_DIR, Path(node_modules))
    if all(_readable_by(str(source), uid) for _, source in files):
        return here
    problems = []
    for root in staging.candidate_roots(runtime_dir, data, uid):
        try:
            folder = staging.stage(files, root, uid)
        except (OSError, staging.StagingError) as exc:
            problems.append(f"{root}: {exc}")
            continue
        return staging.RuntimeFiles(str(folder), str(folder / "node_modules"))
    note = "; ".join(problems)
    log.error("cannot stage the sandbox's runtime files for uid %d: %s", uid, note)
    return staging.RuntimeFiles(str(HARNESS_DIR), node_modules, note=note)


def _first_unreadable(layout: Layout, uid: int) -> Bind | None:
    for bind in layout.binds:
        if not _readable_by(bind.host, uid):
            return bind
    return None


@functools.cache
def _readable_by(path: str, uid: int) -> bool:
    return staging.readable_by(path, uid)


def spawn(config: Config, runtime: str, *, sandboxed: bool) -> Spawned:
    """Start a worker (its rlimits already in force). Returns before the harness says hello."""
    req_r, req_w = os.pipe2(os.O_CLOEXEC)
    res_r, res_w = os.pipe2(os.O_CLOEXEC)
    diag_r, diag_w = os.pipe2(os.O_CLOEXEC)
    host_ends, child_ends = (req_w, res_r, diag_r), (req_r, res_w, diag_w)
    try:
        start = _spawn_jailed if sandboxed else _spawn_bare
        proc, pid = start(config, runtime, child_ends)
    except BaseException:
        _close(*host_ends)
        raise
    finally:
        _close(*child_ends)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        proc.kill()
        proc.wait()
        _close(*host_ends)
        raise SandboxError(f"the worker died while starting ({exc}).")
    return Spawned(proc, pid, pidfd, req_w, res_r, diag_r)


def limits_prefix(config: Config, runtime: str) -> list[str]:
    """``prlimit ... --``: the worker's rlimits, set before bwrap runs, inherited by the jail.

    Set by the child on itself (lowering needs no privilege, unlike setting another uid's
    limits from outside, which needs CAP_SYS_RESOURCE that containers usually drop), and
    soft = hard, so user code cannot raise them back.
    """
    mb = 1024 * 1024
    limits = {
        "cpu": config.cpu_seconds,
        "fsize": config.file_size_mb * mb,
        "nofile": config.open_files,
        "core": 0,
    }
    if family(runtime) == "python":
        limits["as"] = config.memory_mb * mb
    else:
        # V8 reserves gigabytes of address space up front, so Node is held by what it writes to.
        limits["data"] = config.node_memory_mb * mb
    prefix = [config.prlimit, *(f"--{name}={value}:{value}" for name, value in limits.items())]
    # Lower priority first (nice(1) execs the rest): jailed code that burns CPU yields the cores
    # to the web and worker processes, so one tenant's busy loop does not slow every page.
    niceness = ["/usr/bin/nice", "-n", str(config.nice)] if config.nice else []
    return [*niceness, *prefix, "--"]


def node_flags(config: Config) -> list[str]:
    # V8's own heap limit sits below RLIMIT_DATA, so running out of heap is a clean, recognisable
    # "heap out of memory" abort rather than a random failed malloc.
    return [f"--max-old-space-size={max(16, config.node_memory_mb * 2 // 3)}"]


def _worker_argv(config: Config, runtime: str, base: tuple[str, ...], res_w: int) -> list[str]:
    argv = list(base)
    if family(runtime) == "node":
        argv[1:1] = node_flags(config)
    limits = [str(config.log_limit_bytes), str(config.result_limit_bytes)]
    return [*argv, str(res_w), *limits, runtime]


def _spawn_jailed(
    config: Config, runtime: str, child_ends: tuple[int, int, int]
) -> tuple[subprocess.Popen[bytes], int]:
    if not os.access(config.bwrap, os.X_OK):
        raise SandboxUnavailable(f"bwrap not found at {config.bwrap}")
    layout = layout_for(config, runtime)
    bpf_r, bpf_w = os.pipe2(os.O_CLOEXEC)
    info_r, info_w = os.pipe2(os.O_CLOEXEC)
    try:
        # Far below the pipe buffer (the filter is ~1 KiB), so this write cannot block.
        os.write(bpf_w, filter_bpf(allow_threads=family(runtime) == "node"))
        _close(bpf_w)
        bpf_w = -1
        command = _worker_argv(config, runtime, layout.argv, child_ends[1])
        argv = limits_prefix(config, runtime) + bwrap_argv(
            config, layout, command, seccomp_fd=bpf_r, info_fd=info_w
        )
        uid = sandbox_uid(config, runtime)
        proc = _popen(argv, child_ends, [bpf_r, info_w], env={}, uid=uid)
        _close(info_w)
        info_w = -1
        return proc, read_child_pid(info_r, proc, config.start_timeout_s)
    finally:
        _close(bpf_r, bpf_w, info_r, info_w)


def _spawn_bare(
    config: Config, runtime: str, child_ends: tuple[int, int, int]
) -> tuple[subprocess.Popen[bytes], int]:
    layout = layout_for(config, runtime)
    argv = limits_prefix(config, runtime) + _worker_argv(
        config, runtime, layout.bare_argv, child_ends[1]
    )
    proc = _popen(argv, child_ends, [], env={"LANG": "C.UTF-8", "TZ": "UTC"}, uid=None)
    return proc, proc.pid


def _popen(
    argv: list[str],
    child_ends: tuple[int, int, int],
    extra_fds: list[int],
    *,
    env: dict[str, str],
    uid: int | None,
) -> subprocess.Popen[bytes]:
    req_r, res_w, diag_w = child_ends
    as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    try:
        return subprocess.Popen(
            argv,
            stdin=req_r,
            stdout=diag_w,
            stderr=diag_w,
            pass_fds=(res_w, *extra_fds),
            env=env,
            **as_user,
        )
    except FileNotFoundError as exc:
        raise SandboxUnavailable(f"cannot start a worker: {exc.filename} not found")


def read_child_pid(info_r: int, proc: subprocess.Popen[bytes], timeout: float) -> int:
    """bwrap reports the jail's pid 1 (our harness, thanks to ``--as-pid-1``) on its info fd."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([info_r], [], [], remaining)[0]:
            proc.kill()
            proc.wait()
            raise SandboxError("bwrap did not start the worker in time")
        chunk = os.read(info_r, 4096)
        if not chunk:
            break
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError):
        proc.wait()
        raise SandboxUnavailable(
            f"bwrap failed to start the jail (exit status {proc.returncode}); "
            "see the worker's stderr, often: user namespaces are disabled"
        )


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            os.close(fd)
