"""Comparing runs: alignment by testcase index, deltas and filters against a baseline, the
paired tests on data with known answers, errors left out pairwise, and the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evalsite.errors import InvalidInput
from evaluators.services import evaluator_create, evaluator_revise
from runs import compare, testsets
from runs.applications import application_create
from runs.engine import (
    results_log,
    run_close,
    run_create,
    run_create_logged,
    run_execute_inline,
    scenario_annotate,
)
from runs.models import Application
from tests.runs.factories import CAPITALS, make_testset

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "number"},
        "success": {"type": "boolean"},
        "latency_ms": {"type": "number"},
        "label": {"type": "string", "enum": ["good", "bad"]},
    },
}


@pytest.fixture
def judge(project):
    return evaluator_create(
        project=project, kind="feedback", name="Judge", slug="judge", outputs_schema=JUDGE_SCHEMA
    )


def questions(project, n: int, slug: str = "qa"):
    return make_testset(
        project, [{"q": f"question {i}", "answer": f"a{i}"} for i in range(n)], slug
    )


def scored_run(project, version, revision, cells: list, name: str = "run"):
    """A finished logged run whose judge cells are ``cells``: an outputs dict, an error code
    (str), or None for a cell never logged."""
    app = Application.objects.filter(project=project, slug="logged").first()
    app = app or application_create(project=project, name="Logged", slug="logged", kind="logged")
    run = run_create_logged(
        project=project, name=name, testset_version=version, application=app, revisions=[revision]
    )
    steps = {s.type: s.key for s in run.steps.all()}
    entries = []
    for i, cell in enumerate(cells):
        entries += [
            {"scenario": i, "step_key": steps["input"]},
            {"scenario": i, "step_key": steps["invocation"], "outputs": f"{name} answer {i}"},
        ]
        if isinstance(cell, str):
            error = {"code": cell, "message": "judge failed"}
            entries.append({"scenario": i, "step_key": steps["annotation"], "error": error})
        elif cell is not None:
            entries.append({"scenario": i, "step_key": steps["annotation"], "outputs": cell})
    results_log(run=run, entries=entries)
    return run_close(run=run)


def scores(values) -> list:
    return [
        v if isinstance(v, str) or v is None else {"score": v, "success": v >= 0.5} for v in values
    ]


def compared(project, *runs, baseline=None):
    return compare.comparison_get(
        project=project, run_ids=[str(r.pk) for r in runs], baseline=baseline
    )


def report(comparison, **kwargs):
    return compare.comparison_report(comparison, limit=500, **kwargs)


# --- alignment, deltas, filters ---------------------------------------------------------------


def test_it_aligns_rows_by_testcase_index_across_versions(project, judge):
    v1 = questions(project, 3)
    v2 = testsets.testset_rows_add(testset=v1.testset, rows=[{"q": "question 3", "answer": "a3"}])
    base = scored_run(project, v1, judge.head, scores([0.2, 0.5, 0.9]), "base")
    cand = scored_run(project, v2, judge.head, scores([0.4, 0.5, 0.6, 1.0]), "cand")
    comparison = compared(project, base, cand)
    assert not comparison.same_version
    rows = report(comparison, metric="judge.score")["rows"]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["inputs"] == {"q": "question 0", "answer": "a0"}
    assert [c["outputs"] for c in rows[0]["runs"]] == ["base answer 0", "cand answer 0"]
    assert [r["runs"][1]["deltas"].get("judge.score") for r in rows[:3]] == pytest.approx(
        [0.2, 0.0, -0.3]
    )
    assert rows[3]["runs"][0]["present"] is False and rows[3]["runs"][1]["values"] == {
        "judge.score": 1.0
    }
    assert rows[3]["runs"][1]["deltas"] == {}  # nothing to subtract from


def test_it_puts_the_chosen_baseline_first_and_signs_deltas_from_it(project, judge):
    version = questions(project, 2)
    one = scored_run(project, version, judge.head, scores([0.2, 0.8]), "one")
    two = scored_run(project, version, judge.head, scores([0.5, 0.5]), "two")
    comparison = compared(project, one, two, baseline=two.pk)
    assert [r.pk for r in comparison.runs] == [two.pk, one.pk]
    rows = report(comparison, metric="judge.score")["rows"]
    assert [r["runs"][1]["deltas"]["judge.score"] for r in rows] == pytest.approx([-0.3, 0.3])


def test_it_filters_regressions_improvements_and_changes(project, judge):
    version = questions(project, 5)
    base = scored_run(project, version, judge.head, scores([0.2, 0.5, 0.9, 0.7, "boom"]), "base")
    cand = scored_run(project, version, judge.head, scores([0.4, 0.5, 0.6, "timeout", 0.3]), "c")
    comparison = compared(project, base, cand)

    def shown(show):
        return [r["index"] for r in report(comparison, metric="judge.score", show=show)["rows"]]

    assert shown("") == [0, 1, 2, 3, 4]
    assert shown("regressions") == [2]
    assert shown("improvements") == [0]
    assert shown("changed") == [0, 2, 3, 4]  # a value moved, or one side errored
    assert report(comparison, metric="judge.score", show="regressions")["total"] == 1


def test_it_reads_direction_lower_is_better_for_latencies(project, judge):
    version = questions(project, 2)
    base = scored_run(project, version, judge.head, [{"latency_ms": 100}, {"latency_ms": 300}])
    cand = scored_run(project, version, judge.head, [{"latency_ms": 200}, {"latency_ms": 100}])
    comparison = compared(project, base, cand)
    latency = comparison.metric("judge.latency_ms")
    assert latency is not None and latency.higher_is_better is False
    regressions = report(comparison, metric="judge.latency_ms", show="regressions")["rows"]
    assert [r["index"] for r in regressions] == [0]  # slower is worse


def test_it_takes_the_direction_from_the_schema_when_it_says(project):
    schema = {"type": "object", "properties": {"rank": {"type": "number", "x-better": "lower"}}}
    ranker = evaluator_create(project=project, kind="feedback", name="R", outputs_schema=schema)
    version = questions(project, 1)
    runs = [scored_run(project, version, ranker.head, [{"rank": 1}], n) for n in ("a", "b")]
    assert compared(project, *runs).metric("r.rank").higher_is_better is False


def test_it_matches_metrics_by_evaluator_slug_across_revisions(project, judge):
    version = questions(project, 2)
    base = scored_run(project, version, judge.head, scores([0.2, 0.4]), "base")
    revised = evaluator_revise(evaluator=judge, outputs_schema={**JUDGE_SCHEMA, "title": "v2"})
    assert revised is not None and revised.pk != judge.head_id
    cand = scored_run(project, version, revised, scores([0.3, 0.6]), "cand")
    names = [m.name for m in compared(project, base, cand).metrics]
    assert names == ["judge.score", "judge.success", "judge.latency_ms"]  # no categorical


def test_it_compares_engine_runs_of_the_same_testset(project):
    capitals = make_testset(project, CAPITALS)
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    runs = []
    for column in ("outputs", "correct_answer"):
        app = application_create(
            project=project, name=f"From {column}", kind="column", config={"outputs_column": column}
        )
        run = run_create(
            project=project, testset_version=capitals, application=app, revisions=[exact]
        )
        runs.append(run_execute_inline(run=run))
    comparison = compared(project, *runs)
    stats = report(comparison)["stats"]
    success = next(s for s in stats if s["metric"] == "exact.success")
    assert [s["value"] for s in success["runs"]] == [0.5, 1.0]
    test = success["tests"][0]
    assert test["table"] == {
        "both_true": 2,
        "true_to_false": 0,
        "false_to_true": 2,
        "both_false": 0,
    }
    assert test["p_value"] == 0.5 and test["verdict"] == "inconclusive"  # 2 flips prove little
    # A person corrects a cell of the finished baseline: the next comparison sees it at once,
    # although the runs' values were cached.
    italy = runs[0].scenarios.get(index=2)
    scenario_annotate(run=runs[0], scenario=italy, revision=exact, outputs={"success": True})
    again = report(compared(project, *runs))["stats"]
    assert next(s for s in again if s["metric"] == "exact.success")["runs"][0]["value"] == 0.75


# --- statistics on constructed data ----------------------------------------------------------


def test_it_finds_a_clear_improvement_better(project, judge):
    rng = np.random.default_rng(1)
    base_scores = rng.uniform(0.2, 0.5, 40).round(3)
    cand_scores = (base_scores + 0.3 + rng.normal(0, 0.02, 40)).round(3)
    version = questions(project, 40)
    base = scored_run(project, version, judge.head, scores(base_scores.tolist()), "base")
    cand = scored_run(project, version, judge.head, scores(cand_scores.tolist()), "cand")
    stats = {s["metric"]: s for s in report(compared(project, base, cand))["stats"]}
    test = stats["judge.score"]["tests"][0]
    assert test["test"] == "paired bootstrap" and test["n"] == 40
    assert test["difference"] == pytest.approx(float((cand_scores - base_scores).mean()))
    assert 0.28 < test["ci"][0] < test["difference"] < test["ci"][1] < 0.32
    assert test["verdict"] == "better" and test["sign_test"]["up"] == 40
    assert test["p_value"] == pytest.approx(2 / 2**40)


def test_it_finds_identical_runs_inconclusive(project, judge):
    version = questions(project, 20)
    values = [round(0.05 * i, 2) for i in range(20)]
    runs = [scored_run(project, version, judge.head, scores(values), n) for n in ("a", "b")]
    stats = {s["metric"]: s for s in report(compared(project, *runs))["stats"]}
    score, success = stats["judge.score"]["tests"][0], stats["judge.success"]["tests"][0]
    assert (score["difference"], score["ci"], score["verdict"]) == (0.0, [0.0, 0.0], "inconclusive")
    assert (success["difference"], success["p_value"], success["verdict"]) == (
        0.0,
        1.0,
        "inconclusive",
    )


def test_it_runs_mcnemar_on_a_known_table(project, judge):
    # Baseline true/candidate true 59, true->false 6, false->true 16, false/false 80.
    pairs = [(True, True)] * 59 + [(True, False)] * 6 + [(False, True)] * 16 + [(False, False)] * 80
    version = questions(project, len(pairs))
    base = scored_run(project, version, judge.head, [{"success": b} for b, _ in pairs], "base")
    cand = scored_run(project, version, judge.head, [{"success": c} for _, c in pairs], "cand")
    success = report(compared(project, base, cand))["stats"][0]
    assert success["metric"] == "judge.success" and success["type"] == "binary"
    test = success["tests"][0]
    assert test["table"] == {
        "both_true": 59,
        "true_to_false": 6,
        "false_to_true": 16,
        "both_false": 80,
    }
    assert test["method"] == "exact binomial"  # 22 discordant pairs
    expected_p = 2 * sum(math.comb(22, k) for k in range(7)) / 2**22
    assert test["p_value"] == pytest.approx(expected_p) and expected_p == pytest.approx(
        0.0525, abs=1e-4
    )
    assert test["difference"] == pytest.approx(10 / 161)
    assert test["ci"] == pytest.approx([0.0046, 0.1186], abs=1e-4)  # Newcombe (1998)
    assert test["verdict"] == "inconclusive"


def test_it_leaves_errored_cells_out_pairwise(project, judge):
    version = questions(project, 6)
    base = scored_run(project, version, judge.head, scores([0.1, "boom", 0.3, 0.4, 0.5, None]))
    cand = scored_run(project, version, judge.head, scores([0.2, 0.3, "timeout", 0.5, 0.6, 0.7]))
    stats = {s["metric"]: s for s in report(compared(project, base, cand))["stats"]}
    test = stats["judge.score"]["tests"][0]
    assert test["n"] == 3 and test["excluded"] == {"errors": 2, "missing": 1}
    assert test["difference"] == pytest.approx(0.1)  # never a 0 for the errored cells
    summaries = stats["judge.score"]["runs"]
    assert [(s["count"], s["errors"]) for s in summaries] == [(4, 1), (5, 1)]
    assert summaries[0]["value"] == pytest.approx(0.325)


def test_it_computes_mcnemar_exact_and_with_continuity_correction():
    assert compare.binomial_two_sided(1, 10) == 22 / 1024
    assert compare.mcnemar(1, 9) == {"p_value": 22 / 1024, "method": "exact binomial"}
    assert compare.mcnemar(0, 0)["p_value"] == 1.0
    large = compare.mcnemar(121, 59)
    assert large["method"] == "chi-square, continuity-corrected"
    assert large["statistic"] == pytest.approx(61**2 / 180)
    assert large["p_value"] == pytest.approx(5.45e-6, rel=0.01)


def test_it_decides_binary_verdicts_by_mcnemar_and_direction():
    base = np.array([1] * 10 + [0] * 40, dtype=float)
    cand = np.array([1] * 40 + [0] * 10, dtype=float)  # 30 false -> true, none true -> false
    better = compare.paired_test(base, cand, binary=True)
    assert better["verdict"] == "better" and better["difference"] == pytest.approx(0.6)
    assert better["ci"][0] > 0
    worse = compare.paired_test(base, cand, binary=True, higher_is_better=False)
    assert worse["verdict"] == "worse"
    assert compare.paired_test(cand, base, binary=True)["verdict"] == "worse"


def test_it_bootstraps_reproducibly_and_switches_methods_by_size():
    rng = np.random.default_rng(3)
    diffs = rng.normal(0.05, 0.3, 2000)
    first, again = compare.paired_bootstrap(diffs), compare.paired_bootstrap(diffs)
    assert first == again and first["method"] == "bootstrap" and first["resamples"] == 2000
    half = 1.96 * diffs.std() / math.sqrt(len(diffs))
    assert first["ci"] == pytest.approx([diffs.mean() - half, diffs.mean() + half], abs=0.004)
    big = compare.paired_bootstrap(rng.normal(0, 1, 20_000))
    assert big["method"] == "normal"
    few = compare.paired_bootstrap(np.array([1.0, 0.0, -1.0] * 50_000 + [1.0] * 1000))
    assert few["method"] == "bootstrap" and few["ci"][0] < few["mean"] < few["ci"][1]
    assert compare.paired_bootstrap(np.array([]))["ci"] is None


def test_it_runs_the_sign_test():
    result = compare.sign_test(np.array([0.1] * 9 + [-0.1] + [0.0] * 5))
    assert (result["up"], result["down"]) == (9, 1)
    assert result["p_value"] == pytest.approx(22 / 1024)


# --- refusals ---------------------------------------------------------------------------------


def test_it_refuses_runs_of_different_testsets(project, judge):
    one = scored_run(project, questions(project, 2, "qa"), judge.head, scores([0.1, 0.2]))
    two = scored_run(project, questions(project, 2, "other"), judge.head, scores([0.1, 0.2]))
    with pytest.raises(InvalidInput) as caught:
        compared(project, one, two)
    assert "different testsets" in caught.value.fields["runs"][0]


def test_it_refuses_more_than_ten_runs_and_fewer_than_two(project, judge):
    version = questions(project, 1)
    runs = [scored_run(project, version, judge.head, scores([0.5]), f"r{i}") for i in range(11)]
    with pytest.raises(InvalidInput) as caught:
        compared(project, *runs)
    assert caught.value.fields["runs"] == ["Compare at most 10 runs at once (you chose 11)."]
    assert len(compared(project, *runs[:10]).runs) == 10
    with pytest.raises(InvalidInput, match="at least 2"):
        compared(project, runs[0])


def test_it_refuses_runs_without_a_testset_and_unknown_ids(project, judge, other_project):
    version = questions(project, 1)
    run = scored_run(project, version, judge.head, scores([0.5]))
    app = Application.objects.get(project=project, slug="logged")
    loose = run_create_logged(project=project, name="loose", application=app)
    with pytest.raises(InvalidInput, match="Only runs over a testset"):
        compared(project, run, loose)
    with pytest.raises(InvalidInput) as caught:
        compare.comparison_get(project=other_project, run_ids=[str(run.pk), str(loose.pk)])
    assert caught.value.status == 404
    with pytest.raises(InvalidInput, match="numbers"):
        compare.comparison_get(project=project, run_ids=["1", "x"])
