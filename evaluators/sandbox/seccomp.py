"""The seccomp filter handed to bubblewrap (``--seccomp FD``), compiled with libseccomp via ctypes.

Default allow, with a deny list: the namespaces and the read-only root already decide what the
worker can *see*; this filter removes the kernel interfaces that would let it *act* beyond its own
process: creating processes, tracing, mounting, loading kernel code, opening sockets, signalling
anything but itself. A denied call fails with an errno (the user gets an exception, the worker
stays healthy), except foreign architectures (32-bit/x32 entry points), which kill the process.

The worker runs as PID 1 of its own PID namespace (``--as-pid-1``), so "itself" is the constant 1
and signal syscalls can be pinned to it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import tempfile

from .errors import SandboxUnavailable

_ACT_ALLOW = 0x7FFF0000
_ACT_KILL_PROCESS = 0x80000000
_ATTR_ACT_BADARCH = 2
_ATTR_CTL_OPTIMIZE = 8
_CMP_NE = 1
_CMP_MASKED_EQ = 7

_CLONE_THREAD = 0x00010000
# Every CLONE_NEW* flag: a thread must not be able to enter fresh namespaces either.
_CLONE_NEW_FLAGS = (
    0x00000080,  # CLONE_NEWTIME
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
_AF_UNIX = 1
_SELF = 1  # the worker's pid inside its namespace

# Denied outright with EPERM. Names the kernel does not know on this architecture are skipped.
# fmt: off
DENIED = (
    # other processes: the worker may not create, trace, read or move them
    "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "tkill", "move_pages", "migrate_pages",
    # namespaces and mounts
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount",
    "open_by_handle_at", "name_to_handle_at",
    # kernel code, keys, tracing, kernel-side I/O engines that bypass this filter
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "lookup_dcookie",
    # host-wide state
    "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "syslog", "quotactl", "quotactl_fd", "fanotify_init", "iopl", "ioperm",
    "vhangup", "personality", "uselib", "nfsservctl", "sysfs", "_sysctl", "ustat",
    # no sockets at all: the network namespace is empty anyway, and this also closes AF_UNIX,
    # AF_NETLINK, AF_ALG and AF_VSOCK (which no network namespace confines)
    "socket",
)
# fmt: on
# clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes glibc fall back to
# clone(), whose flags we can check.
_ENOSYS_CALLS = ("clone3",)
# Signals may only target the worker itself (pid 1 in its namespace).
_SELF_ONLY = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


@functools.cache
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SandboxUnavailable(f"libseccomp could not be loaded ({exc}); install libseccomp2.")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


class _Filter:
    def __init__(self) -> None:
        self.lib = _lib()
        self.ctx = self.lib.seccomp_init(_ACT_ALLOW)
        if not self.ctx:
            raise SandboxUnavailable("seccomp_init failed")
        self._check(self.lib.seccomp_attr_set(self.ctx, _ATTR_ACT_BADARCH, _ACT_KILL_PROCESS))
        # A binary tree instead of a linear scan: every syscall the worker makes pays for this.
        self.lib.seccomp_attr_set(self.ctx, _ATTR_CTL_OPTIMIZE, 2)

    def rule(self, action: int, name: str, *conds: tuple[int, int, int, int]) -> None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return
        array = (_ArgCmp * max(len(conds), 1))(*[_ArgCmp(*c) for c in conds])
        self._check(self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(conds), array))

    def export(self) -> bytes:
        with tempfile.TemporaryFile() as out:
            self._check(self.lib.seccomp_export_bpf(self.ctx, out.fileno()))
            out.seek(0)
            return out.read()

    def release(self) -> None:
        self.lib.seccomp_release(self.ctx)

    @staticmethod
    def _check(rc: int) -> None:
        if rc < 0:
            raise SandboxUnavailable(f"libseccomp failed: {os.strerror(-rc)}")


@functools.cache
def filter_bpf(*, allow_threads: bool) -> bytes:
    """The compiled BPF program (bytes for ``bwrap --seccomp``). Cached: it never changes.

    ``allow_threads``: Node needs threads (libuv, V8 platform workers); Python does not, and
    without threads no user code can keep running between two evaluations.
    """
    f = _Filter()
    try:
        _add_rules(f, allow_threads=allow_threads)
        return f.export()
    finally:
        f.release()


def _add_rules(f: _Filter, *, allow_threads: bool) -> None:
    deny = _errno_action(errno.EPERM)
    for name in DENIED:
        f.rule(deny, name)
    for name in _ENOSYS_CALLS:
        f.rule(_errno_action(errno.ENOSYS), name)
    for name in _SELF_ONLY:
        f.rule(deny, name, (0, _CMP_NE, _SELF, 0))
    f.rule(deny, "socketpair", (0, _CMP_NE, _AF_UNIX, 0))
    if not allow_threads:
        f.rule(deny, "clone")
        return
    # A clone without CLONE_THREAD is a new process: deny. With it, deny any namespace flag.
    f.rule(deny, "clone", (0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))
    for flag in _CLONE_NEW_FLAGS:
        f.rule(deny, "clone", (0, _CMP_MASKED_EQ, flag, flag))
