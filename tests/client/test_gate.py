"""The gate's exit code from the server's paired tests: a worse metric fails (1), a decided
metric that is not worse passes (0), and too few pairs, too many evaluator errors, a metric
the runs do not share or a failed run cannot be decided (2)."""

from __future__ import annotations

from evalsite_client.gate import FAIL, PASS, UNDECIDED, Options, decide

from tests.client.payloads import comparison, history, metric, run


def test_it_fails_when_a_metric_is_worse():
    decision = decide(comparison(metric(verdict="worse")), run(), Options())
    assert decision.code == FAIL and decision.outcome == "regression"
    assert decision.reasons == ["exact.success: worse (p < 0.001, n=200)"]


def test_it_passes_a_better_or_inconclusive_metric():
    better = metric(verdict="better", cand=0.99)
    same = metric("judge.score", verdict="inconclusive", cand=0.9, p=0.8, type_="continuous")
    decision = decide(comparison(better, same), run(), Options())
    assert decision.code == PASS and decision.reasons == []
    assert [v.code for v in decision.metrics] == [PASS, PASS]


def test_fail_on_inconclusive_fails_a_metric_that_is_not_decided_better():
    same = metric(verdict="inconclusive", cand=0.9, p=0.8)
    assert decide(comparison(same), run(), Options(fail_on="inconclusive")).code == FAIL
    better = metric(verdict="better", cand=0.99)
    assert decide(comparison(better), run(), Options(fail_on="inconclusive")).code == PASS


def test_too_few_pairs_cannot_be_decided_even_when_worse():
    decision = decide(comparison(metric(verdict="worse", n=10)), run(), Options(min_pairs=30))
    assert decision.code == UNDECIDED and decision.outcome == "could not decide"
    assert decision.reasons == ["exact.success: 10 pairs, fewer than --min-pairs 30"]


def test_an_evaluator_erring_too_often_cannot_be_decided():
    flaky_judge = metric(verdict="better", cand=0.95, n=170, cand_errors=30)
    decision = decide(comparison(flaky_judge), run(), Options(max_error_rate=0.1))
    assert decision.code == UNDECIDED
    (reason,) = decision.reasons
    assert "candidate's evaluator errored on 30 of 200 scenarios (15.0%" in reason
    assert decide(comparison(flaky_judge), run(), Options(max_error_rate=0.2)).code == PASS


def test_a_metric_the_runs_do_not_share_cannot_be_decided():
    decision = decide(comparison(metric(verdict="better")), run(), Options(metrics=["judge"]))
    assert decision.code == UNDECIDED
    assert decision.reasons == ["the runs share no metric among judge (shared: exact.success)"]
    both = Options(metrics=["exact.success", "judge.score"])
    decision = decide(comparison(metric(verdict="better")), run(), both)
    assert decision.code == UNDECIDED
    assert "judge.score: not a metric both runs have" in decision.reasons[0]


def test_an_evaluator_slug_chooses_all_of_its_metrics():
    chosen = Options(metrics=["judge"])
    payload = comparison(
        metric(verdict="worse"),
        metric("judge.score", verdict="better", type_="continuous"),
        metric("judge.success", verdict="inconclusive"),
    )
    decision = decide(payload, run(), chosen)
    assert [v.name for v in decision.metrics] == ["judge.score", "judge.success"]
    assert decision.code == PASS  # exact.success is worse, but not gated


def test_a_regression_outweighs_a_metric_that_cannot_be_decided():
    payload = comparison(metric(verdict="worse"), metric("judge.success", verdict="better", n=5))
    decision = decide(payload, run(), Options())
    assert decision.code == FAIL
    assert [v.code for v in decision.metrics] == [FAIL, UNDECIDED]


def test_no_shared_metric_at_all_cannot_be_decided():
    decision = decide(comparison(), run(), Options())
    assert decision.code == UNDECIDED and "share no metric" in decision.reasons[0]


def test_a_candidate_that_failed_or_was_cancelled_cannot_be_decided():
    for status in ("failure", "cancelled"):
        decision = decide(comparison(metric(verdict="better")), run(status=status), Options())
        assert decision.code == UNDECIDED
        assert decision.reasons == [f"run #12 ended {status}"]


def test_flaky_cases_are_noted_and_fail_only_when_asked():
    payload = comparison(metric(verdict="better"))
    noted = decide(payload, run(), Options(), history(flaky=3))
    assert noted.code == PASS
    assert noted.notes[0].startswith("3 flaky test case(s) of the gated evaluators, 3 failing")
    failed = decide(payload, run(), Options(fail_on_flaky=True), history(flaky=3))
    assert failed.code == FAIL
    assert "3 flaky test case(s) fail in the candidate (--fail-on-flaky)" in failed.reasons
    assert decide(payload, run(), Options(fail_on_flaky=True), history()).code == PASS


def test_only_flaky_cases_of_gated_evaluators_failing_now_fail_the_gate():
    payload = comparison(metric(verdict="better"))
    elsewhere = history(flaky=2)
    for case in elsewhere.cases:
        case.evaluator = "some-other-evaluator"  # not gated: main's noise is not this PR's
    assert decide(payload, run(), Options(fail_on_flaky=True), elsewhere).code == PASS
    passing_now = history(flaky=2)
    for case in passing_now.cases:
        case.verdicts = ["pass", "fail", "fail", "pass"]
    decision = decide(payload, run(), Options(fail_on_flaky=True), passing_now)
    assert decision.code == PASS and "0 failing in the candidate" in decision.notes[0]


def test_a_baseline_that_has_not_finished_cannot_be_decided():
    for status in ("running", "cancelled", "failure"):
        base = run(11, status=status)
        decision = decide(comparison(metric(verdict="better")), run(), Options(), baseline=base)
        assert decision.code == UNDECIDED
        assert decision.reasons == [f"the baseline, run #11, is {status}: not a finished run"]
