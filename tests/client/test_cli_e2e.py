"""The CI flow of docs/ci.md, end to end: the client installed with pip from clients/python
into a clean virtualenv, its `evalsite` command run as a subprocess (not a terminal) against a
live evalsite whose runs are computed by real Celery workers. A 200-row baseline on main, then
candidates with a planted regression (exit 1), a planted improvement (exit 0) and a sample too
small to decide (exit 2), each checked by its exit code, its printed progress and its reports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.models import Run
from tests.client.conftest import questions
from tests.runs.factories import make_testset

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ROWS = 200
BASELINE_WRONG = set(range(0, 200, 10))  # 20 wrong: 90 %
REGRESSED_WRONG = BASELINE_WRONG | set(range(101, 200, 2))  # 50 more wrong: 65 %


@pytest.fixture(scope="session")
def evalsite_cli(tmp_path_factory) -> Path:
    """`evalsite` from a fresh virtualenv holding nothing but the client and its dependencies
    (pip install of the sub-directory, its build backend and dependencies from PyPI)."""
    venv = tmp_path_factory.mktemp("client-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            str(ROOT / "clients" / "python"),
        ],
        check=True,
        timeout=600,
    )
    django = subprocess.run([str(venv / "bin" / "python"), "-c", "import django"], check=False)
    assert django.returncode != 0, "the client's virtualenv must not see evalsite's packages"
    return venv / "bin" / "evalsite"


@pytest.fixture
def running_workers(workers):
    workers.start()
    return workers


@pytest.fixture
def qa(project):
    make_testset(project, questions(ROWS, wrong=BASELINE_WRONG), slug="qa")
    application_create(
        project=project,
        name="Column",
        slug="column",
        kind="column",
        config={"outputs_column": "outputs"},
    )
    evaluator_create(
        project=project,
        kind="exact_match",
        name="Exact",
        slug="exact",
        parameters={"correct_answer_key": "answer"},
    )


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class Cli:
    def __init__(self, executable: Path, site):
        self.executable = executable
        # A CI job's environment: the site and key, no terminal, nothing of this process.
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(executable.parent), **site.env}

    def __call__(self, *args) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(self.executable), *map(str, args)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return done


RUN = ["--application", "column", "--evaluator", "exact", "--poll", "0.3"]


def _started(out: str) -> int:
    return int(re.search(r"^run #(\d+) started: ", out, re.MULTILINE).group(1))


def _progress(out: str, run_id: int) -> list[tuple[str, int]]:
    pattern = rf"^run #{run_id} (\w+): (\d+)% \((\d+)/(\d+) cells\) \d+s$"
    return [(m[0], int(m[1])) for m in re.findall(pattern, out, re.MULTILINE)]


@pytest.mark.timeout(900)
def test_ci_runs_gates_and_reports_through_the_installed_cli(
    evalsite_cli, site, qa, running_workers, tmp_path
):
    cli = Cli(evalsite_cli, site)

    # The baseline: a run of main, waited for with plain progress lines (not a terminal).
    done = cli("run", "--testset", "qa", *RUN, "--tag", "branch=main", "--name", "main")
    assert done.returncode == 0, done.stdout + done.stderr
    base = _started(done.stdout)
    assert done.stdout.startswith(
        f"estimate: {ROWS} scenarios x 1 repeat(s), {3 * ROWS} cells, 0 application calls, "
        "0 judge calls"
    )
    progress = _progress(done.stdout, base)
    percents = [p for _, p in progress]
    assert percents == sorted(percents) and percents[0] < 100 and progress[-1] == ("success", 100)
    assert "\r" not in done.stdout
    assert f"run #{base} ended success: {ROWS} scenarios\n  exact.success: 90.0% (n={ROWS})" in (
        done.stdout
    )
    assert Run.objects.get(pk=base).tags == {"branch": "main"}

    # A planted regression, uploaded as the next version of the testset and gated at once.
    regressed = _jsonl(tmp_path / "regressed.jsonl", questions(ROWS, wrong=REGRESSED_WRONG))
    md, junit = tmp_path / "regressed.md", tmp_path / "regressed.xml"
    done = cli(
        "run", "--testset", "qa", "--file", regressed, *RUN, "--tag", "branch=feature",
        "--tag", "pr=7", "--gate-baseline-tag", "branch=main", "--markdown", md, "--junit", junit,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    cand = _started(done.stdout)
    assert f"testset qa: regressed.jsonl uploaded as v2 ({ROWS} rows)" in done.stdout
    assert _progress(done.stdout, cand)[-1] == ("success", 100)
    assert f"gate: run #{cand} against baseline #{base}" in done.stdout
    assert "exact.success: baseline 90.0%, candidate 65.0%, delta -25.0 pp" in done.stdout
    assert "  regressed scenarios: 50\ngate: regression (exit 1)\n" in done.stdout
    summary = md.read_text()
    assert summary.startswith("## ❌ evalsite gate: regression\n")
    assert "| `exact.success` | 90.0% (n=200) | 65.0% (n=200) | -25.0 pp | [" in summary
    assert "| 200 | ❌ worse (p < 0.001) |" in summary
    assert "### Regressed scenarios (50)" in summary
    assert f"[#101]({site.url}/p/acme/runs/{cand}/scenarios/101/)" in summary
    assert "### Regressed test cases (50)" in summary and "Flaky test cases: none." in summary
    report = ET.parse(junit).getroot()
    assert (report.get("tests"), report.get("failures")) == (str(ROWS + 1), str(70 + 1))
    gate_case = report.find("testsuite[@name='evalsite gate']/testcase")
    assert gate_case.get("name") == "exact.success" and gate_case.find("failure") is not None
    failed = {
        c.get("name")
        for c in report.iterfind("testsuite/testcase")
        if c.find("failure") is not None
    }
    assert failed == {"exact.success"} | {f"scenario {i}" for i in REGRESSED_WRONG}

    # A planted improvement: run it, then gate it as its own step.
    improved = _jsonl(tmp_path / "improved.jsonl", questions(ROWS))
    done = cli("run", "--testset", "qa", "--file", improved, *RUN, "--tag", "branch=feature")
    assert done.returncode == 0, done.stdout + done.stderr
    better = _started(done.stdout)
    md = tmp_path / "improved.md"
    done = cli("gate", better, "--baseline-tag", "branch=main", "--markdown", md)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"gate: run #{better} against baseline #{base}" in done.stdout
    assert "exact.success: baseline 90.0%, candidate 100.0%, delta +10.0 pp" in done.stdout
    assert ": better (p < 0.001, n=200)" in done.stdout
    assert "gate: no regression (exit 0)" in done.stdout
    # The history is main's (the baseline's tags) plus the candidate: no flaky cases from the
    # feature branch's regressed run in between.
    assert "flaky" not in done.stdout
    assert md.read_text().startswith("## ✅ evalsite gate: no regression\n")

    # Ten rows are too few pairs to decide on, whatever they say.
    small = _jsonl(tmp_path / "small.jsonl", questions(10, wrong=set(range(10))))
    md = tmp_path / "small.md"
    done = cli(
        "run", "--testset", "qa", "--file", small, *RUN,
        "--gate-baseline-tag", "branch=main", "--markdown", md,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "gate: could not decide (exit 2)" in done.stdout
    assert "  - exact.success: 10 pairs, fewer than --min-pairs 30" in done.stdout
    assert md.read_text().startswith("## ⚠️ evalsite gate: could not decide\n")
