"""The CLI in this process against a live evalsite (runs computed eagerly where they are
queued): estimates and the cap refusal, uploads and runs with their reports, the gate's exit
codes, logging from a file, tags, and one-line errors without tracebacks."""

from __future__ import annotations

import json
import logging
import xml.etree.ElementTree as ET

import pytest
from evalsite_client.cli import main

from evaluators.services import evaluator_create
from runs import testsets
from runs.models import Run, Testset
from tests.client.conftest import finished_run, questions
from tests.runs.factories import make_testset

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(site, capsys, monkeypatch):
    """``cli("run", ...)`` -> (exit code, stdout, stderr), with the site in the environment."""
    for name, value in site.env.items():
        monkeypatch.setenv(name, value)
    # The live server's request log would write to stderr beside the CLI's own.
    for name in ("django.request", "django.server"):
        monkeypatch.setattr(logging.getLogger(name), "disabled", True)

    def invoke(*argv: str):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def test_a_dry_run_prints_the_estimate_and_starts_nothing(cli, qa):
    code, out, _ = cli(
        "run", "--testset", "qa", "--application", "column", "--evaluator", "exact", "--dry-run"
    )
    assert code == 0
    assert out.startswith(
        "estimate: 40 scenarios x 1 repeat(s), 120 cells, 0 application calls, 0 judge calls, "
        "cost $0.0000\n"
    )
    assert "  annotation exact-v1: 40 cells, 0 calls" in out
    assert not Run.objects.exists()


@pytest.fixture
def judge(project, llm_connection):
    return evaluator_create(
        project=project,
        kind="llm_judge",
        name="Judge",
        slug="judge",
        preset="correctness",
        parameters={"connection": llm_connection.slug, "correct_answer_key": "answer"},
    ).head


def test_a_run_over_its_cap_is_refused_up_front_with_the_figures(cli, qa, judge):
    args = ["run", "--testset", "qa", "--application", "column", "--evaluator", "judge"]
    code, out, err = cli(*args, "--max-cost-usd", "0.0001", "--dry-run")
    assert code == 0, err
    assert "OVER THE CAP" in out and "judge calls" in out
    code, out, err = cli(*args, "--max-cost-usd", "0.0001")
    assert code == 2
    assert "caps: run $0.0001, project none: OVER THE CAP" in out
    assert err.startswith("evalsite: refused: $") and "over the cap of $0.0001" in err
    assert "nothing was started" in err and "Traceback" not in err
    assert not Run.objects.exists()


def test_run_uploads_the_file_runs_it_and_writes_its_reports(cli, qa, tmp_path, celery_eager):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in questions(12, wrong={5})))
    code, out, err = cli(
        "run", "--testset", "qa", "--file", rows, "--application", "column",
        "--evaluator", "exact", "--tag", "branch=main", "--tag", "commit=abc123",
        "--name", "nightly", "--markdown", tmp_path / "run.md", "--junit", tmp_path / "run.xml",
    )  # fmt: skip
    assert code == 0, err
    assert "testset qa: rows.jsonl uploaded as v2 (12 rows)" in out
    run = Run.objects.get()
    assert run.name == "nightly" and run.tags == {"branch": "main", "commit": "abc123"}
    assert run.testset_version.version == 2 and run.status == "success"
    assert f"/p/acme/runs/{run.pk}/" in out
    assert f"run #{run.pk} ended success: 12 scenarios\n  exact.success: 91.7% (n=12)" in out
    assert "| `exact.success` | 91.7% | 12 | 0 |" in (tmp_path / "run.md").read_text()
    junit = ET.parse(tmp_path / "run.xml").getroot()
    assert (junit.get("tests"), junit.get("failures")) == ("12", "1")


def _runs(project, qa, wrong_after: set[int]):
    version, app, exact = qa
    base = finished_run(project, version, app, [exact], name="main", tags={"branch": "main"})
    rows = questions(40, wrong=wrong_after)
    cand = finished_run(
        project,
        testsets.testset_revise(testset=version.testset, rows=rows),
        app,
        [exact],
        name="pr",
    )
    return base, cand


def test_gate_exits_1_on_a_planted_regression_and_says_which_scenarios(cli, qa, project, tmp_path):
    base, cand = _runs(project, qa, wrong_after={3, 7} | set(range(10, 30)))
    code, out, _ = cli(
        "gate", cand.pk, "--baseline-tag", "branch=main",
        "--markdown", tmp_path / "gate.md", "--junit", tmp_path / "gate.xml",
    )  # fmt: skip
    assert code == 1
    assert f"gate: run #{cand.pk} against baseline #{base.pk} (the latest finished run of " in out
    assert "exact.success: baseline 95.0%, candidate 45.0%, delta -50.0 pp" in out
    assert "  regressed scenarios: 20\ngate: regression (exit 1)\n" in out
    summary = (tmp_path / "gate.md").read_text()
    assert "## ❌ evalsite gate: regression" in summary
    assert "### Regressed scenarios (20)" in summary
    assert f"/p/acme/runs/{cand.pk}/scenarios/10/" in summary
    assert "### Regressed test cases (20)" in summary
    junit = ET.parse(tmp_path / "gate.xml").getroot()
    assert junit.find("testsuite").get("name") == "evalsite gate"
    assert (junit.get("tests"), junit.get("failures")) == ("41", str(22 + 1))


def test_gate_exits_0_on_an_improvement(cli, qa, project):
    base, cand = _runs(project, qa, wrong_after=set())
    code, out, _ = cli("gate", cand.pk, "--baseline", base.pk, "--min-pairs", "10")
    assert code == 0 and "gate: no regression (exit 0)" in out
    # Two fixed answers out of 40 is not significant: inconclusive, which fails only when asked.
    code, out, _ = cli(
        "gate", cand.pk, "--baseline", base.pk, "--min-pairs", "10", "--fail-on", "inconclusive"
    )
    assert code == 1 and "exact.success: inconclusive" in out


def test_gate_exits_2_below_the_minimum_of_pairs(cli, qa, project):
    base, cand = _runs(project, qa, wrong_after=set(range(40)))
    code, out, _ = cli("gate", cand.pk, "--baseline", base.pk, "--min-pairs", "41")
    assert code == 2
    assert "  - exact.success: 40 pairs, fewer than --min-pairs 41" in out


def test_gate_exits_2_without_a_baseline(cli, qa, project):
    version, app, exact = qa
    cand = finished_run(project, version, app, [exact])
    code, out, _ = cli("gate", cand.pk, "--baseline-tag", "branch=main")
    assert code == 2
    assert (
        f"gate: could not decide (exit 2)\n  - no baseline: testset qa has no finished run tagged "
        f"branch=main older than #{cand.pk}\n"
    ) in out


def test_gate_exits_2_for_a_baseline_that_is_not_there_and_still_writes_the_summary(
    cli, qa, project, tmp_path
):
    version, app, exact = qa
    cand = finished_run(project, version, app, [exact])
    code, out, _ = cli("gate", cand.pk, "--baseline", 999999, "--markdown", tmp_path / "g.md")
    assert code == 2 and "  - no baseline: there is no run #999999 in this project\n" in out
    assert (tmp_path / "g.md").read_text().startswith("## ⚠️ evalsite gate: could not decide")


def test_gate_exits_2_when_the_runs_cannot_be_compared(cli, qa, project):
    version, app, exact = qa
    other = finished_run(project, make_other(project), app, [exact])
    cand = finished_run(project, version, app, [exact])
    code, out, _ = cli("gate", cand.pk, "--baseline", other.pk)
    assert code == 2 and "cannot compare: " in out and "different testsets" in out


def make_other(project):
    return make_testset(project, questions(5), slug="other")


def test_log_sends_a_jsonl_file_as_a_logged_run(cli, project, tmp_path):
    evaluator_create(project=project, kind="feedback", name="Helpful", slug="helpful")
    rows = tmp_path / "logged.jsonl"
    lines = [
        {"inputs": {"q": "a"}, "outputs": "A", "scores": {"helpful": True}},
        {"inputs": {"q": "b"}, "outputs": "B", "scores": {"helpful": False}},
        {"inputs": {"q": "c"}, "error": {"code": "timeout", "message": "slow app"}},
    ]
    rows.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    code, out, err = cli(
        "log", "--file", rows, "--name", "from file", "--evaluator", "helpful",
        "--tag", "branch=main",
    )  # fmt: skip
    assert code == 0, err
    run = Run.objects.get()
    assert run.closed and run.status == "errors" and run.tags == {"branch": "main"}
    assert f"run #{run.pk} closed: 3 scenarios logged" in out
    assert "helpful.success: 50.0% (n=2)" in out


def test_log_names_a_line_that_is_not_json(cli, project, tmp_path):
    rows = tmp_path / "bad.jsonl"
    rows.write_text('{"inputs": {}, "outputs": 1}\n{oops\n')
    code, _, err = cli("log", "--file", rows)
    assert code == 2 and err.startswith(f"evalsite: {rows}:2: not JSON")
    assert not Run.objects.exists()


def test_runs_are_tagged_and_listed_by_tag(cli, qa, project):
    version, app, exact = qa
    run = finished_run(project, version, app, [exact], tags={"branch": "feature"})
    code, out, _ = cli("runs", "tag", run.pk, "pr=482", "commit=9f1c2e7", "--remove", "branch")
    assert code == 0 and out == f"run #{run.pk}: pr=482 commit=9f1c2e7\n"
    code, out, _ = cli("runs", "list", "--tag", "pr=482")
    assert code == 0 and out.startswith(f"#{run.pk}\tsuccess\tqa v1\trun\tpr=482 commit=9f1c2e7")
    assert cli("runs", "list", "--tag", "pr=1")[1] == ""


def test_errors_are_one_line_without_a_traceback(cli, site, monkeypatch, qa):
    code, _, err = cli("runs", "show", "999999")
    assert code == 2 and err == "evalsite: GET runs/999999: HTTP 404: Not found.\n"
    code, _, err = cli("--api-key", "es_wrong", "runs", "list")
    assert code == 2 and err.startswith("evalsite: GET runs: HTTP 401") and err.count("\n") == 1
    monkeypatch.delenv("EVALSITE_URL")
    code, _, err = cli("runs", "list")
    assert (
        code == 2
        and err == "evalsite: Set EVALSITE_URL to your evalsite (https://evals.example.com).\n"
    )
    code, _, err = cli("--url", "http://127.0.0.1:9", "runs", "list")
    assert code == 2 and err.startswith("evalsite: cannot talk to http://127.0.0.1:9:")


def test_usage_errors_exit_2_and_evaluators_is_a_command(cli, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["gate", "12"])  # a baseline is required
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        main(["run", "--testset", "qa", "--application", "a", "--tag", "nameonly"])
    assert exited.value.code == 2 and "a tag is NAME=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", "--testset", "qa", "--application", "a", "--no-wait", "--gate-baseline", "1"])
    assert exited.value.code == 2 and "--no-wait cannot gate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["run", "--testset", "qa", "--application", "a", "--dry-run", "--file", "x.csv"])
    assert exited.value.code == 2 and "--dry-run uploads nothing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "evaluators" in capsys.readouterr().out
    assert Testset.objects.count() == 0


def test_a_testset_is_exported_for_the_ci_job_to_answer(cli, qa, tmp_path):
    code, _, err = cli("testsets", "export", "qa", "--output", tmp_path / "qa.jsonl")
    assert code == 0 and err == f"wrote {tmp_path / 'qa.jsonl'}\n"
    rows = [json.loads(line) for line in (tmp_path / "qa.jsonl").read_text().splitlines()]
    assert rows == questions(40, wrong={3, 7})
    code, _, err = cli("testsets", "export", "nope", "--output", tmp_path / "nope.jsonl")
    assert code == 2 and err.startswith("evalsite: GET testsets/nope/export: HTTP 404")
