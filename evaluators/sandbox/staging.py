"""The harness and the packages sucrase loads, copied where the jail's unprivileged uid can read them.

When evalsite runs as root, bwrap runs as uid 65534 (docs/sandbox.md, "The host uid"), and bwrap
can bind only what that uid can reach. A checkout under ``/root`` or in a private temporary folder
(mode 0700) is out of its reach, so these files are copied once into a **runtime folder** on a
path every parent of which that uid can traverse: directories 0755, files 0644, one sub-folder
per content hash (``<runtime folder>/<sha256>/worker.py``, ``.../node_modules/sucrase/...``).

Several processes, or hosts sharing the folder, may stage at once: each copies into a temporary
folder of its own beside the target and renames it into place; the first rename wins, the others
drop their copy. A folder named by its hash is complete or absent, never half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

# The only packages the TypeScript transpiler loads at run time (its CLI deps stay outside).
NODE_PACKAGES = ("sucrase", "@jridgewell", "ts-interface-checker", "lines-and-columns")
HARNESS_FILES = ("worker.py", "worker.js")
FOLDER_NAME = "sandbox-runtime"
SYSTEM_FOLDER = "/var/lib/evalsite/" + FOLDER_NAME
TMP_FOLDER = "/tmp/evalsite-" + FOLDER_NAME  # noqa: S108 - checked: ours, not a symlink, 0755


@dataclass(frozen=True)
class RuntimeFiles:
    """Where the jail binds its harness and node packages from."""

    harness: str  # the folder holding worker.py and worker.js
    node_modules: str
    note: str = ""  # why the files could not be staged, when they had to be


class StagingError(Exception):
    pass


def sources(harness: Path, node_modules: Path) -> list[tuple[str, Path]]:
    """Every file to stage, as (path inside the staged folder, host file), sorted."""
    files = [(name, harness / name) for name in HARNESS_FILES]
    for package in NODE_PACKAGES:
        top = Path(node_modules, package)
        if not top.exists():
            continue
        top = top.resolve()  # pnpm and npm link keep packages behind symlinks
        for folder, _, names in os.walk(top, followlinks=True):
            for name in names:
                source = Path(folder, name)
                if source.is_file():
                    inside = Path("node_modules", package, source.relative_to(top))
                    files.append((inside.as_posix(), source))
    return sorted(files)


def digest(files: list[tuple[str, Path]]) -> str:
    h = hashlib.sha256()
    for inside, source in files:
        h.update(inside.encode() + b"\0")
        h.update(source.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def stage(files: list[tuple[str, Path]], root: Path, uid: int) -> Path:
    """The folder under ``root`` holding a readable copy of ``files``, made if missing.

    Raises ``StagingError`` when ``root`` cannot be made safe (not ours, writable by others, a
    symlink) or ``uid`` cannot reach it.
    """
    _make_root(root)
    if not traversable(root, uid):
        raise StagingError(f"uid {uid} cannot reach {root}")
    target = root / digest(files)
    if _is_our_dir(target):
        return target
    scratch = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for inside, source in files:
            dest = scratch / inside
            _make_dirs(scratch, dest.parent)
            shutil.copyfile(source, dest)
            os.chmod(dest, 0o644)
        _open_dir(scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            if not _is_our_dir(target):  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def candidate_roots(configured: str, data_dir: str, uid: int) -> list[Path]:
    """Where to stage: the configured folder alone, else the data folder when ``uid`` can
    reach it, then a system folder, then a fixed name under /tmp."""
    if configured:
        return [Path(configured)]
    roots = [Path(SYSTEM_FOLDER), Path(TMP_FOLDER)]
    data = Path(data_dir)
    if traversable(_existing(data), uid):
        roots.insert(0, data / FOLDER_NAME)
    return roots


def traversable(path: Path, uid: int) -> bool:
    """Whether ``uid`` can walk down to ``path`` and into it (a folder)."""
    return readable_by(str(path), uid)


def readable_by(path: str, uid: int) -> bool:
    """Whether ``uid`` (whose only group is gid ``uid``, as bwrap is started) can reach and
    read ``path``: every folder on the way searchable, the file itself readable."""
    parts = Path(path).parts
    for depth in range(1, len(parts) + 1):
        try:
            st = os.stat(Path(*parts[:depth]))
        except OSError:
            return False
        need = 0o4 if depth == len(parts) and not stat.S_ISDIR(st.st_mode) else 0o1
        if st.st_uid == uid:
            bits = (st.st_mode >> 6) & 0o7
        elif st.st_gid == uid:
            bits = (st.st_mode >> 3) & 0o7
        else:
            bits = st.st_mode & 0o7
        if not bits & need:
            return False
    return True


def _make_root(root: Path) -> None:
    """Create ``root`` (and missing parents) 0755; refuse one we do not own or others can
    write to, since the jail would run whatever is staged there."""
    missing = []
    current = root
    while not os.path.lexists(current):
        missing.append(current)
        current = current.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.mkdir(folder, 0o755)
            _open_dir(folder)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise StagingError(f"{root} is not a folder")
    if st.st_uid != os.geteuid():
        raise StagingError(f"{root} belongs to uid {st.st_uid}, not to this process")
    if st.st_mode & 0o777 != 0o755:
        _open_dir(root)


def _make_dirs(top: Path, folder: Path) -> None:
    missing = []
    while folder != top and not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for each in reversed(missing):
        os.mkdir(each)
        _open_dir(each)


def _open_dir(path: Path) -> None:
    # Whatever the umask: the jail's uid must traverse it, and only its owner may write to it.
    os.chmod(path, 0o755)  # noqa: S103


def _is_our_dir(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
