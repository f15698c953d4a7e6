"""Sandbox boundary, the host uid: jailed code never runs as host root, wherever the checkout lives.

Run as root (skipped otherwise). A checkout in a private folder (mode 0700, as ``mktemp -d`` or
``/root`` gives) used to keep the jail at host uid 0; here a copy of the packages runs the real
sandbox from such a folder, in a subprocess, and the host uid of its workers is read from
``/proc``. When dropping is impossible the runner refuses, naming the reason, everywhere an
operator or an editor looks, unless ``EVALSITE_SANDBOX_ALLOW_ROOT`` allows it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evaluators.apps import check_code_runner
from evaluators.sandbox import sandbox_status
from evaluators.sandbox.config import REPO_DIR, Config
from evaluators.sandbox.staging import NODE_PACKAGES, readable_by
from evaluators.services import evaluation_invoke, evaluator_create

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the host uid matters when run as root")

NOBODY = 65534
CODE = {
    "python": "import os\ndef evaluate(inputs, outputs, trace):\n    return os.getuid()\n",
    "typescript": "export function evaluate(): number {\n  return process.getuid();\n}\n",
}
# Runs inside the private checkout: starts real jailed workers and reports what the kernel says.
PROBE = r"""
import json, sys
from pathlib import Path
from evaluators.sandbox import SandboxUnavailable, jail, pool, run_batch, sandbox_status
from evaluators.sandbox.config import load_config

def host_uids(runtime):
    workers = [w for p in pool.registry().pools.values() if p.runtime == runtime for w in p.idle]
    return sorted({
        int(Path(f"/proc/{w.spawned.pid}/status").read_text().split("Uid:")[1].split()[0])
        for w in workers
    })

report = {
    "package": jail.__file__,
    "bound_from": jail.runtime_files(load_config()).harness,
    "status": sandbox_status(probe=False),
    "runs": {},
}
for runtime, code in json.loads(sys.argv[1]).items():
    try:
        [result] = run_batch(
            project_key="p", runtime=runtime, code=code, revision_key=runtime, version="2",
            calls=[{}],
        )
    except SandboxUnavailable as exc:
        report["runs"][runtime] = {"refused": str(exc)}
        continue
    report["runs"][runtime] = {
        "status": result.status, "error": result.error, "jail_uid": result.value,
        "host_uids": host_uids(runtime),
    }
pool.registry().close_all()
print(json.dumps(report))
"""


@pytest.fixture
def private_dir():
    folder = Path(tempfile.mkdtemp(prefix="evalsite-private-"))  # mode 0700
    assert folder.stat().st_mode & 0o777 == 0o700
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def open_dir():
    """A folder uid 65534 can reach: what a data folder outside the checkout looks like."""
    folder = Path(tempfile.mkdtemp(prefix="evalsite-data-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def checkout(private_dir) -> Path:
    """The Python packages and the node packages the jail needs, copied into a private folder."""
    root = private_dir / "evalsite"
    for package in ("evaluators", "evalsite"):
        shutil.copytree(
            REPO_DIR / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    for package in NODE_PACKAGES:
        shutil.copytree(REPO_DIR / "node_modules" / package, root / "node_modules" / package)
    assert not readable_by(str(root / "evaluators/sandbox/harness/worker.py"), NOBODY)
    return root


@pytest.fixture(autouse=True)
def _world_readable_interpreter():
    if not readable_by(Config().python, NOBODY):
        pytest.skip("no world-readable Python here for the jail")


def probe(checkout: Path, **env: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(CODE)],
        cwd=checkout,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(checkout), "LANG": "C.UTF-8", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["package"].startswith(str(checkout)), report["package"]
    return report


def test_it_drops_to_an_unprivileged_host_uid_from_a_checkout_in_a_private_folder(
    checkout, open_dir
):
    report = probe(checkout, EVALSITE_DATA_DIR=str(open_dir))
    for runtime in CODE:
        run = report["runs"][runtime]
        assert run["status"] == "success", run
        assert run["host_uids"] == [NOBODY], run
        assert run["jail_uid"] == NOBODY
    assert report["status"]["available"] is True
    assert report["status"]["uid"] == {"python": NOBODY, "javascript": NOBODY}


def test_it_stages_the_runtime_files_readable_in_the_data_folder(checkout, open_dir):
    report = probe(checkout, EVALSITE_DATA_DIR=str(open_dir))
    staged = Path(report["bound_from"])
    assert staged.parent == open_dir / "sandbox-runtime"
    for folder, _, names in os.walk(staged.parent):
        assert Path(folder).stat().st_mode & 0o777 == 0o755, folder
        for name in names:
            assert Path(folder, name).stat().st_mode & 0o777 == 0o644, name
    assert (staged / "node_modules/sucrase/package.json").is_file()
    assert not [p for p in staged.parent.iterdir() if p.name.startswith(".staging-")]


def test_it_refuses_to_run_code_as_host_root_naming_the_reason(checkout, private_dir):
    unreachable = private_dir / "runtime"  # inside the private folder: uid 65534 cannot get in
    report = probe(checkout, EVALSITE_SANDBOX_RUNTIME_DIR=str(unreachable))
    harness = checkout / "evaluators/sandbox/harness"
    for runtime in CODE:
        refused = report["runs"][runtime]["refused"]
        assert "would run as host root" in refused
        assert str(harness) in refused and f"uid 65534 cannot reach {unreachable}" in refused
        assert "EVALSITE_SANDBOX_ALLOW_ROOT=1" in refused
    status = report["status"]
    assert status["available"] is False and "would run as host root" in status["problem"]


def test_it_runs_as_host_root_only_when_allowed(checkout, private_dir):
    report = probe(
        checkout,
        EVALSITE_SANDBOX_RUNTIME_DIR=str(private_dir / "runtime"),
        EVALSITE_SANDBOX_ALLOW_ROOT="1",
    )
    for runtime in CODE:
        assert report["runs"][runtime]["host_uids"] == [0]
    status = report["status"]
    assert status["available"] is True
    assert len(status["warnings"]) == 2 and "run as host root" in status["warnings"][0]


# --- what operators and editors see, in this process: an interpreter uid 65534 cannot read -----


@pytest.fixture
def checker(project):
    return evaluator_create(project=project, kind="code", name="Checker")


@pytest.fixture
def private_python(private_dir, settings) -> str:
    """A copy of the interpreter in a private folder, as pyenv under /root would be."""
    python = private_dir / "bin" / "python3"
    python.parent.mkdir()
    shutil.copy2(Config().python, python)
    settings.EVALSITE_CODE_RUNNER = "sandbox"
    settings.EVALSITE_SANDBOX_PYTHON = str(python)
    return str(python)


@pytest.mark.django_db
def test_it_fails_code_evaluations_with_the_reason_never_a_score(private_python):
    result = evaluation_invoke(
        kind="code",
        parameters={"runtime": "python", "code": CODE["python"], "version": "2"},
        inputs={},
        outputs="",
    )
    assert result.status == "error" and result.outputs is None
    assert result.error["code"] == "sandbox_unavailable"
    assert f"cannot read {private_python}" in result.error["message"]
    assert "EVALSITE_SANDBOX_PYTHON" in result.error["message"]


def test_it_names_the_reason_in_the_start_up_check(private_python):
    [warning] = check_code_runner()
    assert warning.id == "evaluators.W001"
    assert "Python code would run as host root" in warning.msg
    assert f"cannot read {private_python}" in warning.msg


def test_it_names_the_reason_on_the_code_editor_banner(owner_client, checker, private_python):
    html = owner_client.get("/p/acme/evaluators/checker/").content.decode()
    assert '<div class="message-error mb" role="alert" id="sandbox-status">' in html
    assert "would run as host root" in html and private_python in html


def test_it_warns_everywhere_when_root_is_allowed(owner_client, checker, private_python, settings):
    settings.EVALSITE_SANDBOX_ALLOW_ROOT = True
    assert sandbox_status(probe=False)["uid"]["python"] == 0
    [warning] = check_code_runner()
    assert warning.id == "evaluators.W002" and "run as host root" in warning.msg
    html = owner_client.get("/p/acme/evaluators/checker/").content.decode()
    assert '<div class="message-warning mb" role="alert" id="sandbox-status">' in html
    assert "EVALSITE_SANDBOX_ALLOW_ROOT" in html


def test_it_refuses_an_explicit_root_uid_unless_allowed(settings):
    settings.EVALSITE_CODE_RUNNER = "sandbox"
    settings.EVALSITE_SANDBOX_UID = 0
    status = sandbox_status(probe=False)
    assert status["available"] is False
    assert "EVALSITE_SANDBOX_UID=0" in status["problem"]
    settings.EVALSITE_SANDBOX_ALLOW_ROOT = True
    assert sandbox_status(probe=False)["uid"] == {"python": 0, "javascript": 0}
