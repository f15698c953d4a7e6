"""The gate's decision: from the server's paired tests (``GET /runs/compare``) to an exit code.
Nothing is recomputed here; the statistics are evalsite's (docs/compare.md).

Per chosen metric: *could not decide* when the candidate has no paired test, when fewer than
``min_pairs`` scenarios were valued in both runs, or when either run's evaluator errored on
more than ``max_error_rate`` of its scenarios; otherwise *fail* when the verdict is ``worse``
(or ``inconclusive`` with ``fail_on="inconclusive"``), else *pass*. Overall: exit 1 when a
metric failed (or, with ``fail_on_flaky``, a flaky case of a gated evaluator fails in the
candidate), else 2 when a metric could not be decided (or nothing could be compared, or either
run has not finished), else 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evalsite_client.models import (
    FINISHED_STATUSES,
    Comparison,
    History,
    MetricComparison,
    MetricSummary,
    PairedTest,
    Run,
)

PASS, FAIL, UNDECIDED = 0, 1, 2
OUTCOMES = {PASS: "no regression", FAIL: "regression", UNDECIDED: "could not decide"}
DEFAULT_MIN_PAIRS = 30
DEFAULT_MAX_ERROR_RATE = 0.1


@dataclass
class Options:
    metrics: list[str] = field(default_factory=list)  # names or evaluator slugs; empty: all
    min_pairs: int = DEFAULT_MIN_PAIRS
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    fail_on: str = "worse"  # worse | inconclusive
    fail_on_flaky: bool = False


@dataclass
class MetricVerdict:
    metric: MetricComparison
    baseline: MetricSummary | None
    candidate: MetricSummary | None
    test: PairedTest | None
    code: int  # PASS, FAIL or UNDECIDED
    reasons: list[str]

    @property
    def name(self) -> str:
        return self.metric.metric


@dataclass
class Decision:
    code: int
    reasons: list[str]
    metrics: list[MetricVerdict]
    baseline_id: int | None = None
    candidate_id: int | None = None
    notes: list[str] = field(default_factory=list)  # said in the report, no effect on the code

    @property
    def outcome(self) -> str:
        return OUTCOMES[self.code]


def undecided(reason: str, **kwargs) -> Decision:
    """A gate that could not even compare (no baseline, a failed run, an API refusal)."""
    return Decision(code=UNDECIDED, reasons=[reason], metrics=[], **kwargs)


def metrics_choose(
    comparison: Comparison, wanted: list[str]
) -> tuple[list[MetricComparison], list[str]]:
    """The compared metrics named by ``wanted`` (a metric name, or an evaluator slug for all of
    its metrics), and the names that matched none."""
    if not wanted:
        return list(comparison.metrics), []
    chosen: list[MetricComparison] = []
    unknown = []
    for name in wanted:
        found = [m for m in comparison.metrics if name in (m.metric, m.evaluator)]
        if not found:
            unknown.append(name)
        chosen += [m for m in found if m not in chosen]
    return chosen, unknown


def error_rate(summary: MetricSummary | None) -> float:
    if summary is None or not summary.count + summary.errors:
        return 0.0
    return summary.errors / (summary.count + summary.errors)


def metric_verdict(
    metric: MetricComparison, baseline_id: int, candidate_id: int, options: Options
) -> MetricVerdict:
    base, cand = metric.summary(baseline_id), metric.summary(candidate_id)
    test = metric.test_of(candidate_id)
    reasons = []
    if test is None:
        reasons.append(f"{metric.metric}: no paired test for run #{candidate_id}")
    else:
        if test.n < options.min_pairs:
            reasons.append(
                f"{metric.metric}: {test.n} pairs, fewer than --min-pairs {options.min_pairs}"
            )
        for label, summary in (("baseline", base), ("candidate", cand)):
            rate = error_rate(summary)
            if rate > options.max_error_rate:
                reasons.append(
                    f"{metric.metric}: the {label}'s evaluator errored on {summary.errors} of "
                    f"{summary.count + summary.errors} scenarios ({rate:.1%}, over "
                    f"--max-error-rate {options.max_error_rate:.1%})"
                )
    if reasons:
        return MetricVerdict(metric, base, cand, test, UNDECIDED, reasons)
    failing = {"worse"} if options.fail_on == "worse" else {"worse", "inconclusive"}
    code = FAIL if test.verdict in failing else PASS
    why = f"{metric.metric}: {test.verdict} ({p_text(test.p_value)}, n={test.n})"
    return MetricVerdict(metric, base, cand, test, code, [why])


def decide(
    comparison: Comparison,
    candidate: Run,
    options: Options,
    history: History | None = None,
    baseline: Run | None = None,
) -> Decision:
    baseline_id = comparison.baseline
    ids = {"baseline_id": baseline_id, "candidate_id": candidate.id}
    if candidate.status not in FINISHED_STATUSES:
        return undecided(f"run #{candidate.id} ended {candidate.status}", **ids)
    if baseline is not None and baseline.status not in FINISHED_STATUSES:
        return undecided(
            f"the baseline, run #{baseline.id}, is {baseline.status}: not a finished run", **ids
        )
    chosen, unknown = metrics_choose(comparison, options.metrics)
    shared = ", ".join(m.metric for m in comparison.metrics) or "none"
    if not chosen:
        asked = ", ".join(options.metrics) if options.metrics else "any metric"
        return undecided(f"the runs share no metric among {asked} (shared: {shared})", **ids)
    verdicts = [metric_verdict(m, baseline_id, candidate.id, options) for m in chosen]
    reasons = [r for v in verdicts if v.code != PASS for r in v.reasons]
    reasons += [f"{name}: not a metric both runs have (shared: {shared})" for name in unknown]
    codes = {v.code for v in verdicts} | ({UNDECIDED} if unknown else set())
    notes = []
    gated = {v.metric.evaluator for v in verdicts}
    flaky = [c for c in (history.cases if history else []) if c.klass == "flaky"]
    flaky = [c for c in flaky if c.evaluator in gated]
    failing = [c for c in flaky if c.verdicts and c.verdicts[-1] in ("fail", "mixed")]
    if failing and options.fail_on_flaky:
        codes.add(FAIL)
        reasons.append(f"{len(failing)} flaky test case(s) fail in the candidate (--fail-on-flaky)")
    elif flaky:
        notes.append(
            f"{len(flaky)} flaky test case(s) of the gated evaluators, {len(failing)} failing "
            "in the candidate; they fail the gate only with --fail-on-flaky"
        )
    code = FAIL if FAIL in codes else UNDECIDED if UNDECIDED in codes else PASS
    return Decision(code=code, reasons=reasons, metrics=verdicts, notes=notes, **ids)


def p_text(p: float | None) -> str:
    if p is None:
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"
