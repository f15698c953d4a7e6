"""Test-case history: each test case's verdicts, per evaluator, across the last runs of a testset,
and its class (regressed, flaky, fixed, stable, unknown). See docs/history.md for the rules.

The verdicts of every run in the window are read with one statement (plus one for the test
cases and one for the shown cases' inputs), so the number of queries does not grow with the
number of runs; the classes are computed on a verdict matrix with numpy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

import numpy as np
from django.db import connection

from evalsite.errors import InvalidInput
from evaluators.models import Evaluator
from runs import engine, metrics, selectors
from runs.models import Run, RunStatus, Testset

# Verdict codes in the matrix; the order matters: codes >= PASS are verdicts ("valued").
MISSING, ERROR, PASS, FAIL, MIXED = range(5)
VERDICTS = ("missing", "error", "pass", "fail", "mixed")
CLASSES = ("regressed", "flaky", "fixed", "stable_fail", "stable_pass", "unknown")
FINISHED = (RunStatus.SUCCESS, RunStatus.ERRORS, RunStatus.FAILURE)
DEFAULT_RUNS, MIN_RUNS, MAX_RUNS = 20, 2, 100
DEFAULT_LIMIT, MAX_LIMIT = 200, 1000
VERDICT_KEY = "success"
PREVIEW_COLUMNS, PREVIEW_CHARS = 3, 120


@dataclass(frozen=True)
class HistoryEvaluator:
    slug: str  # the mapping's column prefix: the evaluator's slug
    metric: str  # "<slug>.success"


@dataclass
class CaseHistory:
    index: int
    evaluator: str
    klass: str
    flips: int
    flip_rate: float | None  # flips / (verdicts - 1); None with fewer than 2 verdicts
    verdicts: list[str]  # aligned with History.runs
    inputs: str = ""  # a short preview of the test case


@dataclass
class History:
    testset: Testset
    runs: list[Run]  # oldest first; the candidate is the last one
    baseline: Run | None
    candidate: Run | None
    evaluators: list[HistoryEvaluator]  # the ones shown
    available: list[HistoryEvaluator]  # every evaluator with a verdict in the window
    counts: dict[str, int] = field(default_factory=dict)  # per class, before the class filter
    count: int = 0  # rows (case x evaluator) that pass the class filter
    offset: int = 0
    limit: int = DEFAULT_LIMIT
    cases: list[CaseHistory] = field(default_factory=list)  # one page of them


@dataclass
class HistoryQuery:
    """What a history shows; the page and the API read it from the same query parameters."""

    evaluators: list[str] = field(default_factory=list)  # refs: slug or id
    runs: int = DEFAULT_RUNS
    tags: dict[str, str] = field(default_factory=dict)
    baseline: Run | None = None
    candidate: Run | None = None
    classes: list[str] = field(default_factory=list)
    offset: int = 0
    limit: int = DEFAULT_LIMIT

    def arguments(self, **overrides) -> dict:
        """This query as ``testcase_history``'s keyword arguments (a page pages its own way)."""
        return {f.name: getattr(self, f.name) for f in fields(self)} | overrides

    @classmethod
    def from_params(cls, params, *, testset: Testset) -> HistoryQuery:
        """``evaluator`` (repeatable), ``runs``, ``tag`` (repeatable ``name:value``),
        ``baseline``, ``candidate``, ``class`` (repeatable), ``offset``, ``limit``. Raises
        ``InvalidInput`` naming the first bad parameter."""
        classes = [c for c in params.getlist("class") if c]
        unknown = [c for c in classes if c not in CLASSES]
        if unknown:
            raise InvalidInput(
                {"class": [f"Unknown class {unknown[0]!r}; one of {', '.join(CLASSES)}."]}
            )
        return cls(
            evaluators=[e for e in params.getlist("evaluator") if e],
            runs=_number(params, "runs", DEFAULT_RUNS, MIN_RUNS, MAX_RUNS),
            tags=engine.tag_filters_parse([t for t in params.getlist("tag") if t]),
            baseline=history_run_get(testset=testset, ref=params.get("baseline"), field="baseline"),
            candidate=history_run_get(
                testset=testset, ref=params.get("candidate"), field="candidate"
            ),
            classes=classes,
            offset=_number(params, "offset", 0, 0, None),
            limit=_number(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT),
        )


def _number(params, name: str, default: int, low: int, high: int | None) -> int:
    raw = (params.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdecimal() or int(raw) < low or (high is not None and int(raw) > high):
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise InvalidInput({name: [f"{raw[:20]!r} is not a whole number {span}."]})
    return int(raw)


def history_run_get(*, testset: Testset, ref, field: str) -> Run | None:
    """The run ``ref`` (an id) of this testset, any version, finished; None when ``ref`` is
    empty. Anything else is an ``InvalidInput`` on ``field``."""
    ref = str(ref or "").strip()
    if not ref:
        return None
    if not ref.isdecimal():
        raise InvalidInput({field: [f"{ref[:20]!r} is not a run id."]})
    run = (
        selectors.run_list(project=testset.project)
        .filter(pk=int(ref), is_online=False, testset_version__testset=testset)
        .first()
    )
    if run is None:
        raise InvalidInput({field: [f"No run {ref} of testset {testset.slug} in this project."]})
    if run.is_active:
        raise InvalidInput({field: [f"Run {ref} is still {run.status}; its verdicts may change."]})
    return run


def testcase_history(
    *,
    testset: Testset,
    evaluators: list[str] | None = None,
    runs: int = DEFAULT_RUNS,
    tags: dict[str, str] | None = None,
    baseline: Run | None = None,
    candidate: Run | None = None,
    classes: list[str] | None = None,
    offset: int = 0,
    limit: int = DEFAULT_LIMIT,
) -> History:
    """Each test case's verdict per evaluator in the last ``runs`` finished runs of the testset
    (any version; those whose tags contain ``tags``), oldest first, ending at the candidate (the
    newest run unless given); its class, flips and flip rate; counts per class; one page
    (``offset``, ``limit``) of the cases of the chosen ``classes``. Cases are aligned by
    testcase index, as in comparisons. The baseline and candidate are always in the window."""
    window = _window(testset, runs, tags or {}, baseline, candidate)
    candidate = window[-1] if window else None
    if baseline is None and len(window) > 1:
        baseline = window[-2]
    available = _evaluators_in(window)
    shown = _evaluators_chosen(testset, available, evaluators or [])
    history = History(
        testset=testset,
        runs=window,
        baseline=baseline,
        candidate=candidate,
        evaluators=shown,
        available=available,
        counts=dict.fromkeys(CLASSES, 0),
        offset=offset,
        limit=limit,
    )
    if not window or not shown:
        return history
    indexes, matrix = _verdicts(window, shown)
    klass, flips, rates = classify(matrix, baseline=window.index(baseline) if baseline else None)
    history.counts = {name: int((klass == code).sum()) for code, name in enumerate(CLASSES)}
    chosen = [CLASSES.index(c) for c in classes or CLASSES]
    rows = np.flatnonzero(np.isin(klass, chosen))
    history.count = len(rows)
    page = [(r, int(indexes[r // len(shown)])) for r in rows[offset : offset + limit]]
    previews = _previews(testset, window, sorted({index for _, index in page}))
    history.cases = [
        CaseHistory(
            index=index,
            evaluator=shown[r % len(shown)].slug,
            klass=CLASSES[klass[r]],
            flips=int(flips[r]),
            flip_rate=None if np.isnan(rates[r]) else round(float(rates[r]), 4),
            verdicts=[VERDICTS[v] for v in matrix[r]],
            inputs=previews.get(index, ""),
        )
        for r, index in page
    ]
    return history


# --- the window of runs ----------------------------------------------------------------------


def _window(
    testset: Testset, n: int, tags: dict, baseline: Run | None, candidate: Run | None
) -> list[Run]:
    """The last ``n`` finished runs up to the candidate, oldest first, holding the baseline."""
    if baseline and candidate and not _older(baseline, candidate):
        raise InvalidInput({"baseline": ["The baseline must be older than the candidate."]})
    runs = selectors.run_list(project=testset.project, tags=tags).filter(
        testset_version__testset=testset, is_online=False, status__in=FINISHED
    )
    fixed = [r for r in (baseline, candidate) if r is not None]
    if candidate is not None:
        runs = runs.filter(created_at__lte=candidate.created_at).exclude(
            created_at=candidate.created_at, pk__gt=candidate.pk
        )
    runs = runs.exclude(pk__in=[r.pk for r in fixed]).order_by("-created_at", "-id")
    found = list(runs[: max(n - len(fixed), 0)]) + fixed
    found.sort(key=lambda r: (r.created_at, r.pk))
    if candidate is None and baseline is not None and found[-1] is baseline:
        raise InvalidInput({"baseline": ["The baseline must be older than the candidate."]})
    return found


def _older(run: Run, other: Run) -> bool:
    return (run.created_at, run.pk) < (other.created_at, other.pk)


# --- evaluators -------------------------------------------------------------------------------


def _evaluators_in(runs: list[Run]) -> list[HistoryEvaluator]:
    """Evaluators with a boolean ``success`` column in any of the runs, the newest run's first."""
    found: dict[str, HistoryEvaluator] = {}
    for run in reversed(runs):
        for slug in _verdict_paths(run):
            found.setdefault(slug, HistoryEvaluator(slug=slug, metric=f"{slug}.{VERDICT_KEY}"))
    return list(found.values())


def _verdict_paths(run: Run) -> dict[str, tuple[str, list[str]]]:
    """Per evaluator (column prefix) of a run: the step key and the path of ``success`` inside
    the annotation's outputs, read off the run's mappings."""
    out = {}
    for mapping in run.mappings:
        column = mapping["column"]
        if column["kind"] != "annotation" or column.get("type") != "binary":
            continue
        prefix, _, key = column["name"].partition(".")
        if key != VERDICT_KEY:
            continue
        path = mapping["step"]["path"].removeprefix(metrics.OUTPUTS_PREFIX + ".").split(".")
        out.setdefault(prefix, (mapping["step"]["key"], path))
    return out


def _evaluators_chosen(
    testset: Testset, available: list[HistoryEvaluator], refs: list[str]
) -> list[HistoryEvaluator]:
    if not refs:
        return available
    known = Evaluator.objects.for_project(testset.project)
    slugs = []
    for ref in refs:
        found = known.by_ref(ref).values_list("slug", flat=True).first()
        if found is None:
            raise InvalidInput({"evaluator": [f"No evaluator {ref[:100]!r} in this project."]})
        slugs.append(found)
    return [e for e in available if e.slug in slugs]


# --- verdicts ---------------------------------------------------------------------------------


def _verdicts(runs: list[Run], evaluators: list[HistoryEvaluator]) -> tuple[np.ndarray, np.ndarray]:
    """The test case indexes of the window, and the verdict matrix: one row per (index,
    evaluator), index-major, one column per run. A cell is pass / fail when every repeat with
    a value says so, mixed when they disagree, error when its cells hold an error and no value
    (the evaluator failed, or was skipped because the application failed), missing otherwise
    (no scenario, the evaluator is not in that run, not evaluated yet, no boolean)."""
    position = {e.slug: i for i, e in enumerate(evaluators)}
    lookups, params = [], []
    for column, run in enumerate(runs):
        for slug, (step_key, path) in _verdict_paths(run).items():
            if slug in position:
                lookups.append("(%s::bigint, %s::text, %s::int, %s::int, %s::text[])")
                params += [run.pk, step_key, column, position[slug], path]
    run_ids = [r.pk for r in runs]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT index FROM runs_scenario "
            "WHERE run_id = ANY(%s) AND testcase_id IS NOT NULL ORDER BY index",
            [run_ids],
        )
        indexes = np.array([row[0] for row in cursor.fetchall()], dtype=np.int64)
        rows = []
        if lookups:
            # Only placeholders are spliced in; every value is a parameter.
            cursor.execute(
                "SELECT m.col, s.index, m.ev, "  # noqa: S608
                "count(*) FILTER (WHERE a.outputs #> m.path = 'true'::jsonb), "
                "count(*) FILTER (WHERE a.outputs #> m.path = 'false'::jsonb), "
                "count(*) FILTER (WHERE r.status = 'error' OR r.error IS NOT NULL) "
                f"FROM (VALUES {', '.join(lookups)}) AS m(run_id, step_key, col, ev, path) "
                "JOIN runs_result r ON r.run_id = m.run_id AND r.step_key = m.step_key "
                "JOIN runs_scenario s ON s.id = r.scenario_id AND s.testcase_id IS NOT NULL "
                "LEFT JOIN runs_annotation a ON a.id = r.annotation_id "
                "GROUP BY m.col, s.index, m.ev",
                params,
            )
            rows = cursor.fetchall()
    matrix = np.full((len(indexes) * len(evaluators), len(runs)), MISSING, dtype=np.int8)
    if rows:
        found = np.array(rows, dtype=np.int64)
        col, index, ev, true, false, errors = found.T
        code = np.select(
            [(true > 0) & (false > 0), true > 0, false > 0, errors > 0],
            [MIXED, PASS, FAIL, ERROR],
            MISSING,
        )
        row = np.searchsorted(indexes, index) * len(evaluators) + ev
        matrix[row, col] = code
    return indexes, matrix


FLAKY_FLIPS = 2


def classify(matrix: np.ndarray, *, baseline: int | None) -> tuple[np.ndarray, ...]:
    """Per row of a verdict matrix (columns oldest first, the candidate last): the class (an
    index into CLASSES), the flips and the flip rate (NaN with fewer than 2 verdicts).

    Only pass, fail and mixed are verdicts; error and missing are skipped over. Two
    consecutive verdicts make a flip when they differ or either is mixed. Flaky: at least
    ``FLAKY_FLIPS`` flips in the window (it went both ways) or a mixed verdict; otherwise a
    case is regressed / fixed when the baseline's verdict and the candidate's differ, else
    stable (pass or fail) by its latest verdict.
    """
    rows, width = matrix.shape
    valued = matrix >= PASS
    at = np.where(valued, np.arange(width), -1)
    last = np.maximum.accumulate(at, axis=1)  # the latest verdict's column, up to each column
    before = np.concatenate([np.full((rows, 1), -1), last[:, :-1]], axis=1)
    previous = np.take_along_axis(matrix, before.clip(min=0), axis=1)
    flipped = (
        valued & (before >= 0) & ((matrix != previous) | (matrix == MIXED) | (previous == MIXED))
    )
    flips = flipped.sum(axis=1)
    count = valued.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(count >= 2, flips / np.maximum(count - 1, 1), np.nan)
    candidate = matrix[:, -1]
    prior = previous[:, -1]  # the last verdict before the candidate (if any)
    base = prior
    if baseline is not None and baseline < width - 1:
        base = np.where(valued[:, baseline], matrix[:, baseline], prior)
    has_prior = before[:, -1] >= 0
    # One change is a step (a fix, a regression) the classes below name; going back and forth
    # (two flips or more in the window) or repeats that disagree within a run is flakiness.
    flaky = (flips >= FLAKY_FLIPS) | (matrix == MIXED).any(axis=1)
    steady = ~flaky & has_prior
    klass = np.select(
        [
            flaky,
            steady & (base == PASS) & (candidate == FAIL),
            steady & (base == FAIL) & (candidate == PASS),
            count < 2,
            matrix[np.arange(rows), last[:, -1].clip(min=0)] == FAIL,
        ],
        [CLASSES.index(c) for c in ("flaky", "regressed", "fixed", "unknown", "stable_fail")],
        CLASSES.index("stable_pass"),
    )
    return klass, flips, rates


# --- previews ---------------------------------------------------------------------------------


def _previews(testset: Testset, runs: list[Run], indexes: list[int]) -> dict[int, str]:
    """A short text of each test case's first columns, from the newest run that has it."""
    if not indexes:
        return {}
    newest_first = [r.pk for r in reversed(runs)]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT ON (index) index, inputs FROM runs_scenario "
            "WHERE run_id = ANY(%s) AND index = ANY(%s) AND testcase_id IS NOT NULL "
            "ORDER BY index, array_position(%s::bigint[], run_id)",
            [newest_first, indexes, newest_first],
        )
        found = cursor.fetchall()
    columns = list(testset.head.columns) if testset.head else []
    return {index: _preview(_loads(inputs), columns) for index, inputs in found}


def _loads(value):
    return json.loads(value) if isinstance(value, str) else value


def _preview(inputs, columns: list[str]) -> str:
    if not isinstance(inputs, dict):
        return _text(inputs)[:PREVIEW_CHARS]
    names = [c for c in columns if c in inputs] or list(inputs)
    text = ", ".join(f"{n}: {_text(inputs[n])}" for n in names[:PREVIEW_COLUMNS])
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
