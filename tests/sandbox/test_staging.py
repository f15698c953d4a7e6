"""Staging the harness and node packages where the jail's unprivileged uid can read them
(evaluators/sandbox/staging.py): content-addressed, atomic when several processes race, and never
into a folder someone else controls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from evaluators.sandbox.config import REPO_DIR
from evaluators.sandbox.jail import HARNESS_DIR
from evaluators.sandbox.staging import (
    FOLDER_NAME,
    SYSTEM_FOLDER,
    TMP_FOLDER,
    StagingError,
    candidate_roots,
    digest,
    readable_by,
    sources,
    stage,
)

NOBODY = 65534
RACE = r"""
import json, sys, time
from pathlib import Path
from evaluators.sandbox.jail import HARNESS_DIR
from evaluators.sandbox.staging import sources, stage
root, node_modules, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
files = sources(HARNESS_DIR, Path(node_modules))
time.sleep(max(0.0, start - time.time()))
print(json.dumps(str(stage(files, Path(root), 65534))))
"""


@pytest.fixture
def open_dir():
    folder = Path(tempfile.mkdtemp(prefix="evalsite-staging-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def files():
    return sources(HARNESS_DIR, REPO_DIR / "node_modules")


def test_it_names_the_staged_folder_by_the_content(files, open_dir):
    staged = stage(files, open_dir / "runtime", NOBODY)
    assert staged.name == digest(files)
    for inside, source in files:
        assert (staged / inside).read_bytes() == source.read_bytes()
    assert stage(files, open_dir / "runtime", NOBODY) == staged


def test_it_stages_once_when_processes_race(files, open_dir):
    root = open_dir / "runtime"
    start = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, str(root), str(REPO_DIR / "node_modules"), start],
            cwd=REPO_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    answers = {json.loads(proc.communicate(timeout=60)[0]) for proc in procs}
    assert all(proc.returncode == 0 for proc in procs)
    assert answers == {str(root / digest(files))}
    assert [p.name for p in root.iterdir()] == [digest(files)]  # no scratch folder left behind


def test_it_makes_folders_0755_and_files_0644_whatever_the_umask(files, open_dir):
    old = os.umask(0o077)
    try:
        staged = stage(files, open_dir / "deep" / "runtime", NOBODY)
    finally:
        os.umask(old)
    assert (open_dir / "deep").stat().st_mode & 0o777 == 0o755
    for folder, _, names in os.walk(staged.parent):
        assert Path(folder).stat().st_mode & 0o777 == 0o755, folder
        for name in names:
            assert Path(folder, name).stat().st_mode & 0o777 == 0o644, name
    assert readable_by(str(staged / "node_modules/sucrase/package.json"), NOBODY)


def test_it_refuses_a_folder_the_jail_uid_cannot_reach(files):
    private = Path(tempfile.mkdtemp())  # 0700
    try:
        with pytest.raises(StagingError, match=f"uid {NOBODY} cannot reach"):
            stage(files, private / "runtime", NOBODY)
    finally:
        shutil.rmtree(private)


def test_it_refuses_a_symlink_for_its_folder(files, open_dir):
    (open_dir / "elsewhere").mkdir()
    (open_dir / "runtime").symlink_to(open_dir / "elsewhere")
    with pytest.raises(StagingError, match="is not a folder"):
        stage(files, open_dir / "runtime", NOBODY)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a folder to another uid")
def test_it_refuses_a_folder_someone_else_owns(files, open_dir):
    planted = open_dir / "runtime"
    planted.mkdir(mode=0o755)
    os.chown(planted, NOBODY, NOBODY)
    with pytest.raises(StagingError, match=f"belongs to uid {NOBODY}"):
        stage(files, planted, NOBODY)


def test_it_prefers_the_configured_folder_then_a_reachable_data_folder(open_dir):
    assert candidate_roots("/srv/evalsite-runtime", str(open_dir), NOBODY) == [
        Path("/srv/evalsite-runtime")
    ]
    assert candidate_roots("", str(open_dir / "data"), NOBODY) == [
        open_dir / "data" / FOLDER_NAME,
        Path(SYSTEM_FOLDER),
        Path(TMP_FOLDER),
    ]


def test_it_skips_a_data_folder_inside_a_private_checkout():
    private = Path(tempfile.mkdtemp())
    try:
        roots = candidate_roots("", str(private / "checkout" / ".data"), NOBODY)
    finally:
        shutil.rmtree(private)
    assert roots == [Path(SYSTEM_FOLDER), Path(TMP_FOLDER)]


def test_it_reads_the_group_bits_for_the_jail_uid_group(open_dir):
    path = open_dir / "file"
    path.write_text("x")
    path.chmod(0o604)  # others may read, the group may not
    assert readable_by(str(path), NOBODY)
    if os.geteuid() == 0:
        os.chown(path, 0, NOBODY)
        assert not readable_by(str(path), NOBODY)
