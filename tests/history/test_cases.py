"""The history service: planted stable, flaky, regressed and fixed cases classified from real
runs, errors left out of the verdicts, the window of runs (tags, baseline, candidate), repeats
that disagree, filters and paging, and a query count that does not grow with the runs."""

from __future__ import annotations

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create
from runs import history, testsets
from runs.applications import application_create
from runs.engine import results_log, run_close, run_create_logged
from runs.models import Application
from tests.history.conftest import CASES, MAIN, column_run
from tests.runs.factories import make_testset

FEEDBACK = {"type": "object", "properties": {"success": {"type": "boolean"}}}


def by_case(found: history.History) -> dict[str, history.CaseHistory]:
    return {CASES[c.index]: c for c in found.cases}


def logged_run(project, version, revision, cells: list, name="logged", tags=None):
    """A closed logged run; per scenario: a verdict (bool), a list of verdicts (one per
    repeat), an error code (str) or None (never logged)."""
    app = Application.objects.filter(project=project, slug="logged").first()
    app = app or application_create(project=project, name="Logged", slug="logged", kind="logged")
    run = run_create_logged(
        project=project,
        name=name,
        testset_version=version,
        application=app,
        revisions=[revision],
        tags=tags,
    )
    steps = {s.type: s.key for s in run.steps.all()}
    entries = []
    for i, cell in enumerate(cells):
        repeats = cell if isinstance(cell, list) else [cell]
        entries.append({"scenario": i, "step_key": steps["input"]})
        for r, verdict in enumerate(repeats):
            entries.append(
                {"scenario": i, "step_key": steps["invocation"], "repeat_idx": r, "outputs": "x"}
            )
            if isinstance(verdict, str):
                error = {"code": verdict, "message": "the judge failed"}
                entries.append(
                    {
                        "scenario": i,
                        "step_key": steps["annotation"],
                        "repeat_idx": r,
                        "error": error,
                    }
                )
            elif verdict is not None:
                entries.append(
                    {
                        "scenario": i,
                        "step_key": steps["annotation"],
                        "repeat_idx": r,
                        "outputs": {"success": verdict},
                    }
                )
    results_log(run=run, entries=entries)
    return run_close(run=run)


@pytest.fixture
def judge(project):
    return evaluator_create(
        project=project, kind="feedback", name="Judge", slug="judge", outputs_schema=FEEDBACK
    )


# --- classes ------------------------------------------------------------------------------------


def test_it_classifies_planted_stable_flaky_regressed_and_fixed_cases(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset, tags=MAIN)
    assert [r.pk for r in found.runs] == [r.pk for r in runs[:4]]
    assert found.candidate.pk == runs[3].pk and found.baseline.pk == runs[2].pk
    cases = by_case(found)
    assert {name: c.klass for name, c in cases.items()} == {
        "stable pass": "stable_pass",
        "stable fail": "stable_fail",
        "flaky": "flaky",
        "regressed": "regressed",
        "fixed": "fixed",
        "errored": "stable_pass",
    }
    assert cases["flaky"].verdicts == ["pass", "fail", "pass", "pass"]
    assert (cases["flaky"].flips, cases["flaky"].flip_rate) == (2, pytest.approx(0.6667))
    assert (cases["regressed"].flips, cases["regressed"].flip_rate) == (1, pytest.approx(0.3333))
    assert found.counts == {
        "regressed": 1,
        "flaky": 1,
        "fixed": 1,
        "stable_fail": 1,
        "stable_pass": 2,
        "unknown": 0,
    }
    assert cases["stable pass"].inputs.startswith("case: stable pass, correct_answer: Paris")


def test_it_does_not_count_an_error_as_a_fail(planted):
    testset, _ = planted
    errored = by_case(history.testcase_history(testset=testset, tags=MAIN))["errored"]
    # The application had no answer in the candidate: the evaluator's cell is an error, which
    # is no verdict, so the case stays a stable pass instead of a regression.
    assert errored.verdicts == ["pass", "pass", "pass", "error"]
    assert (errored.klass, errored.flips, errored.flip_rate) == ("stable_pass", 0, 0.0)


def test_it_leaves_evaluator_errors_out_of_the_verdicts(project, judge):
    version = make_testset(project, [{"q": "a"}, {"q": "b"}], slug="two")
    logged_run(project, version, judge.head, [True, False], "one")
    logged_run(project, version, judge.head, ["timeout", "timeout"], "two")
    logged_run(project, version, judge.head, [True, True], "three")
    found = history.testcase_history(testset=version.testset)
    first, second = found.cases
    assert first.verdicts == ["pass", "error", "pass"] and first.klass == "stable_pass"
    assert first.flip_rate == 0.0
    assert second.verdicts == ["fail", "error", "pass"] and second.klass == "fixed"


def test_it_calls_repeats_that_disagree_mixed_and_the_case_flaky(project, judge):
    version = make_testset(project, [{"q": "a"}, {"q": "b"}], slug="two")
    logged_run(project, version, judge.head, [[True, True], [True, True]], "one")
    logged_run(project, version, judge.head, [[True, False], [True, "boom"]], "two")
    first, second = history.testcase_history(testset=version.testset).cases
    assert first.verdicts == ["pass", "mixed"] and first.klass == "flaky"
    assert first.flips == 1 and first.flip_rate == 1.0
    # An errored repeat is left out: the other repeat's pass is the verdict.
    assert second.verdicts == ["pass", "pass"] and second.klass == "stable_pass"


def test_it_calls_a_case_with_fewer_than_two_verdicts_unknown(project, judge):
    version = make_testset(project, [{"q": "a"}, {"q": "b"}], slug="two")
    logged_run(project, version, judge.head, [True, None], "one")
    logged_run(project, version, judge.head, ["boom", False], "two")
    first, second = history.testcase_history(testset=version.testset).cases
    assert (first.verdicts, first.klass, first.flip_rate) == (["pass", "error"], "unknown", None)
    assert (second.verdicts, second.klass) == (["missing", "fail"], "unknown")


def test_it_classifies_a_verdict_matrix():
    p, f, e, m, x = (
        history.VERDICTS.index(v) for v in ("pass", "fail", "error", "missing", "mixed")
    )
    rows = np.array(
        [
            [p, p, p, p],  # stable pass
            [f, e, f, f],  # stable fail, an error skipped over
            [p, f, p, p],  # flipped before the candidate
            [p, p, e, f],  # the baseline errored: the verdict before it counts
            [f, f, f, p],  # fixed
            [p, p, f, p],  # failed in the baseline, but flipped before: flaky, not fixed
            [m, m, m, p],  # one verdict
            [p, x, p, p],  # repeats disagreed once
            [f, p, p, p],  # fixed once, long ago, and stayed fixed: a step, not flakiness
            [p, f, f, f],  # regressed before the baseline and stayed failing
        ],
        dtype=np.int8,
    )
    klass, flips, rates = history.classify(rows, baseline=2)
    assert [history.CLASSES[k] for k in klass] == [
        "stable_pass",
        "stable_fail",
        "flaky",
        "regressed",
        "fixed",
        "flaky",
        "unknown",
        "flaky",
        "stable_pass",
        "stable_fail",
    ]
    assert flips.tolist() == [0, 0, 2, 1, 1, 2, 0, 2, 1, 1]
    assert np.isnan(rates[6]) and rates[3] == pytest.approx(1 / 2) and rates[0] == 0.0


# --- the window -------------------------------------------------------------------------------


def test_it_takes_every_finished_run_without_tags_and_the_newest_as_candidate(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset)
    assert [r.pk for r in found.runs] == [r.pk for r in runs]
    assert found.candidate.pk == runs[4].pk and found.baseline.pk == runs[3].pk
    cases = by_case(found)
    # The feature branch passes again where main regressed: the main run's failure now lies
    # before the candidate, so the case flipped twice.
    assert cases["regressed"].verdicts == ["pass", "pass", "pass", "fail", "pass"]
    assert cases["regressed"].klass == "flaky"
    # Fixed on main and still passing on the branch: one step, before the baseline.
    assert cases["fixed"].verdicts == ["fail", "fail", "fail", "pass", "pass"]
    assert cases["fixed"].klass == "stable_pass"


def test_it_filters_runs_by_tags(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset, tags={"branch": "main", "commit": "c2"})
    assert [r.pk for r in found.runs] == [runs[1].pk]
    assert found.baseline is None and {c.klass for c in found.cases} == {"unknown"}
    assert history.testcase_history(testset=testset, tags={"branch": "nope"}).runs == []


def test_it_ends_the_window_at_the_chosen_candidate(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset, candidate=runs[2])
    assert [r.pk for r in found.runs] == [r.pk for r in runs[:3]]
    cases = by_case(found)
    assert cases["regressed"].klass == "stable_pass" and cases["fixed"].klass == "stable_fail"
    assert cases["flaky"].klass == "flaky"


def test_it_keeps_a_chosen_baseline_in_a_short_window(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset, runs=2, baseline=runs[0], candidate=runs[3])
    assert [r.pk for r in found.runs] == [runs[0].pk, runs[3].pk]
    cases = by_case(found)
    assert cases["flaky"].klass == "stable_pass"  # its flip lies outside the window
    assert cases["regressed"].klass == "regressed" and cases["fixed"].klass == "fixed"


def test_it_holds_baseline_and_candidate_whatever_their_tags(planted):
    testset, runs = planted
    found = history.testcase_history(testset=testset, tags=MAIN, candidate=runs[4])
    assert [r.pk for r in found.runs] == [r.pk for r in runs]
    assert found.candidate.pk == runs[4].pk


def test_it_refuses_a_baseline_newer_than_the_candidate(planted):
    testset, runs = planted
    with pytest.raises(InvalidInput) as raised:
        history.testcase_history(testset=testset, baseline=runs[3], candidate=runs[1])
    assert "baseline" in raised.value.fields


def test_it_refuses_runs_of_another_testset_as_baseline_or_candidate(project, planted, judge):
    testset, _ = planted
    other = make_testset(project, [{"q": "a"}], slug="other")
    run = logged_run(project, other, judge.head, [True])
    for name in ("baseline", "candidate"):
        with pytest.raises(InvalidInput) as raised:
            history.history_run_get(testset=testset, ref=str(run.pk), field=name)
        assert list(raised.value.fields) == [name]


def test_it_reads_runs_of_every_version_aligned_by_index(project, judge):
    v1 = make_testset(project, [{"q": "a"}], slug="grows")
    v2 = testsets.testset_rows_add(testset=v1.testset, rows=[{"q": "b"}])
    logged_run(project, v1, judge.head, [True], "one")
    logged_run(project, v2, judge.head, [True, False], "two")
    first, second = history.testcase_history(testset=v1.testset).cases
    assert first.verdicts == ["pass", "pass"] and second.verdicts == ["missing", "fail"]


# --- filters, paging, evaluators ----------------------------------------------------------------


def test_it_filters_by_class_and_pages_the_cases(planted):
    testset, _ = planted
    found = history.testcase_history(testset=testset, tags=MAIN, classes=["regressed", "flaky"])
    assert [CASES[c.index] for c in found.cases] == ["flaky", "regressed"]
    assert found.count == 2 and found.counts["stable_pass"] == 2  # counts ignore the filter
    page = history.testcase_history(testset=testset, tags=MAIN, offset=2, limit=3)
    assert [c.index for c in page.cases] == [2, 3, 4] and page.count == 6


def test_it_shows_one_row_per_case_and_evaluator_and_filters_evaluators(project, planted):
    testset, runs = planted
    regex = evaluator_create(
        project=project,
        kind="regex",
        name="Says Paris",
        slug="says-paris",
        parameters={"pattern": "^Paris$"},
    )
    column_run(
        project,
        runs[0].testset_version,
        [runs[0].steps.get(type="annotation").revision, regex.head],
        "r1",
        MAIN,
    )
    both = history.testcase_history(testset=testset, tags=MAIN)
    assert [e.slug for e in both.evaluators] == ["exact", "says-paris"]
    assert [(c.index, c.evaluator) for c in both.cases[:2]] == [(0, "exact"), (0, "says-paris")]
    # The regex evaluator was only in the newest run: a single verdict.
    assert both.cases[1].verdicts == ["missing", "missing", "missing", "missing", "pass"]
    only = history.testcase_history(testset=testset, tags=MAIN, evaluators=[str(regex.pk)])
    assert {c.evaluator for c in only.cases} == {"says-paris"}
    with pytest.raises(InvalidInput) as raised:
        history.testcase_history(testset=testset, evaluators=["nope"])
    assert "evaluator" in raised.value.fields


def test_it_reads_the_same_number_of_queries_for_5_and_20_runs(project, judge):
    version = make_testset(project, [{"q": f"q{i}"} for i in range(3)], slug="many")
    for i in range(20):
        logged_run(project, version, judge.head, [True, i % 2 == 0, "boom"], f"run {i}")
    counts = {}
    for n in (5, 20):
        with CaptureQueriesContext(connection) as queries:
            found = history.testcase_history(testset=version.testset, runs=n)
        assert len(found.runs) == n
        counts[n] = len(queries)
    assert counts[5] == counts[20] <= 4
