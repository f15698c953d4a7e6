"""Comparing runs of one testset: shared metrics, per-scenario values read from the read model
in one statement for all runs, cards with paired tests, and aligned rows (docs/compare.md)."""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from evalsite.errors import InvalidInput
from evalsite.jsonpaths import dig
from evalsite.models import Project
from runs import metrics as run_metrics
from runs import selectors
from runs.compare.selectors import aligned_cells, read_model_values, results_values
from runs.compare.stats import TOLERANCE, paired_test
from runs.models import ACTIVE_RUN_STATUSES, Run, RunStep

MAX_RUNS = 10


FILTERS = ("regressions", "improvements", "changed")


# Metric names (last key segment) for which lower is better; anything else: higher is better.
# An outputs schema can say so itself: {"type": "number", "x-better": "lower"}.
LOWER_IS_BETTER = {
    "latency",
    "latency_ms",
    "duration",
    "duration_ms",
    "tool_ms",
    "tokens",
    "cost",
    "costs",
    "abs_error",
    "error",
    "errors",
    "error_count",
    "distance",
    "edit_distance",
    "loss",
    "failed_calls",
    "retries",
    "untimed_calls",
    "wer",
    "cer",
}


@dataclass(frozen=True)
class SharedMetric:
    name: str  # "exact.success": evaluator slug + metric key
    evaluator: str
    key: str
    type: str  # binary | continuous | discrete
    higher_is_better: bool
    steps: dict[int, str]  # run id -> step key
    paths: dict[int, list[str]]  # run id -> path inside the annotation's outputs

    @property
    def numeric(self) -> bool:
        return self.type != "binary"


@dataclass
class Comparison:
    runs: list[Run]  # the baseline first
    metrics: list[SharedMetric]
    input_columns: list[str] = field(default_factory=list)

    @property
    def baseline(self) -> Run:
        return self.runs[0]

    @property
    def candidates(self) -> list[Run]:
        return self.runs[1:]

    @property
    def same_version(self) -> bool:
        return len({r.testset_version_id for r in self.runs}) == 1

    def metric(self, name: str) -> SharedMetric | None:
        return next((m for m in self.metrics if m.name == name), None)

    def chosen(self, name: str) -> list[SharedMetric]:
        """One metric by name, or all of them when the name is empty or unknown."""
        found = self.metric(name)
        return [found] if found else self.metrics


def run_ids_parse(values: list[str]) -> list[str]:
    """``?runs=1,2&runs=3`` -> ["1", "2", "3"], in order, without repeats."""
    ids: list[str] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if part and part not in ids:
                ids.append(part)
    return ids


def comparison_get(
    *, project: Project, run_ids: list[str], baseline: str | int | None = None
) -> Comparison:
    """The runs to compare (2 to 10 batch runs of one testset), baseline first, and the metrics
    they share. Refuses anything else with an ``InvalidInput`` naming the problem (404 for a
    run that is not in this project)."""
    if any(not str(i).isdecimal() for i in run_ids):
        raise InvalidInput({"runs": ["Run ids are numbers, e.g. ?runs=12,13."]})
    ids = [int(i) for i in run_ids]
    if len(ids) < 2:
        raise InvalidInput({"runs": ["Choose at least 2 runs to compare."]})
    if len(ids) > MAX_RUNS:
        raise InvalidInput(
            {"runs": [f"Compare at most {MAX_RUNS} runs at once (you chose {len(ids)})."]}
        )
    found = {r.pk: r for r in selectors.run_list(project=project).filter(pk__in=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise InvalidInput(
            {"runs": [f"No run {', '.join(map(str, missing))} in this project."]}, status=404
        )
    runs = [found[i] for i in ids]
    _check_same_testset(runs)
    base = int(baseline) if str(baseline or "").isdecimal() else ids[0]
    if base not in found:
        raise InvalidInput({"baseline": ["The baseline must be one of the compared runs."]})
    runs = [found[base], *(r for r in runs if r.pk != base)]
    inputs = [m["column"]["name"] for m in runs[0].mappings if m["column"]["kind"] == "input"]
    return Comparison(runs=runs, metrics=shared_metrics(runs), input_columns=inputs)


def _check_same_testset(runs: list[Run]) -> None:
    loose = [r for r in runs if r.testset_version_id is None]
    if loose:
        names = ", ".join(f"#{r.pk} {r.name}" for r in loose)
        raise InvalidInput(
            {"runs": [f"Only runs over a testset can be compared; {names} has none."]}
        )
    testsets: dict[int, list[Run]] = {}
    for run in runs:
        testsets.setdefault(run.testset_version.testset_id, []).append(run)
    if len(testsets) > 1:
        groups = "; ".join(
            f"{group[0].testset_version.testset.name}: {', '.join(f'#{r.pk}' for r in group)}"
            for group in testsets.values()
        )
        raise InvalidInput(
            {
                "runs": [
                    "These runs use different testsets, and rows can only be aligned within one "
                    f"testset ({groups})."
                ]
            }
        )


def comparable_runs(*, project: Project, include=(), limit: int = 100) -> list[Run]:
    """Finished batch runs over a testset, newest first, plus the runs already chosen (by id):
    what the compare form offers."""
    runs = selectors.run_list(project=project).filter(
        is_online=False, testset_version__isnull=False
    )
    recent = list(runs.exclude(status__in=ACTIVE_RUN_STATUSES)[:limit])
    chosen = [int(i) for i in include if str(i).isdecimal()]
    missing = set(chosen) - {r.pk for r in recent}
    return recent + list(runs.filter(pk__in=missing)) if missing else recent


def shared_metrics(runs: list[Run]) -> list[SharedMetric]:
    """Numeric and binary evaluator metrics present in every run, in the baseline's order."""
    per_run = [_metric_mappings(run) for run in runs]
    hints = _direction_hints(runs[0])
    shared = []
    for name, (step, metric_type, _) in per_run[0].items():
        found = [m.get(name) for m in per_run]
        if any(f is None or _family(f[1]) != _family(metric_type) for f in found):
            continue
        evaluator, key = name.split(".", 1)
        types = {f[1] for f in found}
        shared.append(
            SharedMetric(
                name=name,
                evaluator=evaluator,
                key=key,
                type=types.pop() if len(types) == 1 else "continuous",
                higher_is_better=higher_is_better(key, hints.get((step, key))),
                steps={run.pk: f[0] for run, f in zip(runs, found, strict=True)},
                paths={run.pk: f[2] for run, f in zip(runs, found, strict=True)},
            )
        )
    return shared


def _metric_mappings(run: Run) -> dict[str, tuple[str, str, list[str]]]:
    out = {}
    for mapping in run.mappings:
        column = mapping["column"]
        if column["kind"] != "annotation" or column.get("type") not in (
            "binary",
            "continuous",
            "discrete",
        ):
            continue
        path = mapping["step"]["path"].removeprefix(run_metrics.OUTPUTS_PREFIX + ".").split(".")
        out.setdefault(column["name"], (mapping["step"]["key"], column["type"], path))
    return out


def _family(metric_type: str) -> str:
    return "binary" if metric_type == "binary" else "numeric"


def _direction_hints(baseline: Run) -> dict[tuple[str, str], str]:
    """``x-better`` found in the baseline's revisions' outputs schemas, per (step, key)."""
    hints = {}
    steps = RunStep.objects.filter(run=baseline, type="annotation").select_related("revision")
    for step in steps:
        schema = step.revision.outputs_schema if step.revision else None
        for key, prop in _properties(schema):
            if prop.get("x-better") in ("lower", "higher"):
                hints[(step.key, key)] = prop["x-better"]
    return hints


def _properties(schema: dict | None, prefix: str = ""):
    for name, prop in ((schema or {}).get("properties") or {}).items():
        if isinstance(prop, dict):
            key = f"{prefix}.{name}" if prefix else name
            yield key, prop
            yield from _properties(prop, key)


def higher_is_better(key: str, hint: str | None = None) -> bool:
    if hint:
        return hint != "lower"
    last = key.rsplit(".", 1)[-1].lower()
    return not (last in LOWER_IS_BETTER or last.endswith("_ms"))


@dataclass
class RunValues:
    present: np.ndarray  # bool per testcase index: the run has this scenario
    values: dict[str, np.ndarray]  # metric -> float per index, NaN without a value
    errors: dict[str, np.ndarray]  # metric -> bool per index: errored and no value
    binary: bool = True  # binary metrics hold 0/1 per scenario (no repeats)

    def padded(self, length: int) -> RunValues:
        extra = length - len(self.present)
        if extra <= 0:
            return self
        return RunValues(
            np.concatenate([self.present, np.zeros(extra, dtype=bool)]),
            {k: np.concatenate([v, np.full(extra, np.nan)]) for k, v in self.values.items()},
            {k: np.concatenate([v, np.zeros(extra, dtype=bool)]) for k, v in self.errors.items()},
            self.binary,
        )

    @property
    def nbytes(self) -> int:
        arrays = [self.present, *self.values.values(), *self.errors.values()]
        return sum(a.nbytes for a in arrays)


def comparison_values(
    comparison: Comparison, metrics: list[SharedMetric] | None = None
) -> dict[int, RunValues]:
    """Every scenario's value of each metric, per run, on one index axis."""
    metrics = comparison.metrics if metrics is None else metrics
    found = runs_values(comparison.runs, metrics)
    length = max(len(v.present) for v in found.values())
    return {pk: v.padded(length) for pk, v in found.items()}


def run_values(run: Run, metrics: list[SharedMetric]) -> RunValues:
    return runs_values([run], metrics)[run.pk]


def runs_values(runs: list[Run], metrics: list[SharedMetric]) -> dict[int, RunValues]:
    """Runs' per-scenario values of these metrics: the mean over its repeats of each
    successful cell, and whether a cell without a value errored. Read from the read model
    (``ScenarioValue``), for all runs at once, when it is current (refreshed since the run's
    last cell); else, and for a metric it holds no row of, from the results. Kept in a small
    per-process cache while the run and its read model do not change."""
    found, stale, current = {}, [], []
    for run in runs:
        cached = _CACHE.get(*_cache_key(run, metrics))
        if cached is not None:
            found[run.pk] = cached
        else:
            (current if run.read_model_current else stale).append(run)
    if current:
        found |= _read_model_values(current, metrics)
    for run in stale:
        found[run.pk] = _results_values(run, metrics)
    for run in (*current, *stale):
        if not run.is_active:
            _CACHE.put(*_cache_key(run, metrics), found[run.pk])
    return found


def _cache_key(run: Run, metrics: list[SharedMetric]) -> tuple[tuple, tuple]:
    key = (run.pk, tuple((m.name, m.steps[run.pk], tuple(m.paths[run.pk])) for m in metrics))
    stamp = (run.status, run.progressed_at, run.finished_at, run.repeats, run.metrics_refreshed_at)
    return key, stamp


def _read_model_values(runs: list[Run], metrics: list[SharedMetric]) -> dict[int, RunValues]:
    cells = [
        [(run.pk, m.steps[run.pk], ".".join(m.paths[run.pk])) for m in metrics] for run in runs
    ]
    read = read_model_values(
        [run.pk for run in runs],
        [c for cs in cells for c in cs],
        {run.pk: run.metrics_refreshed_at for run in runs},
    )
    found = {}
    for run, run_cells in zip(runs, cells, strict=True):
        indexes = read.present.get(run.pk, range(0))
        if isinstance(indexes, range):  # a dense pack's: every index to its last
            present = np.ones(len(indexes), dtype=bool)
        else:
            present = np.zeros(int(indexes.max()) + 1 if len(indexes) else 0, dtype=bool)
            present[indexes] = True
        values, errors, missing = {}, {}, []
        for metric, cell in zip(metrics, run_cells, strict=True):
            if cell not in read.values:
                missing.append(metric)
                continue
            values[metric.name], errors[metric.name] = _aligned(
                present, *read.values[cell], read.errored.get(cell, np.empty(0, dtype=np.int32))
            )
        found[run.pk] = RunValues(present, values, errors, binary=run.repeats == 1)
        if missing:  # the read model holds no row of these keys: read them from the results
            extra = _results_values(run, missing).padded(len(present))
            found[run.pk].values |= {k: v[: len(present)] for k, v in extra.values.items()}
            found[run.pk].errors |= {k: v[: len(present)] for k, v in extra.errors.items()}
    return found


def _aligned(present: np.ndarray, at, column: np.ndarray, errored_at: np.ndarray):
    """One metric's values and errors on the run's index axis; scenarios without a testcase
    (present is false) have neither. ``at``: the values' indexes, or a dense pack's range."""
    length = len(present)
    if isinstance(at, range) and len(at) == length:  # 0 to n - 1 in order: the values themselves
        value = column
    else:
        value = np.full(length, np.nan)
        if isinstance(at, range):
            value[: min(len(at), length)] = column[:length]
        else:
            inside = at < length
            value[at[inside]] = column[inside]
    if not present.all():  # (scenarios without a testcase have no value: nor an error, below)
        value[~present] = np.nan
    errored = np.zeros(length, dtype=bool)
    errored[errored_at[errored_at < length]] = True
    if len(errored_at):
        errored &= present & np.isnan(value)
    return value, errored


def _results_values(run: Run, metrics: list[SharedMetric]) -> RunValues:
    """The values dug out of each result's annotation: what the read model's refresh computes,
    for what it does not hold yet."""
    columns = [(m.steps[run.pk], m.paths[run.pk]) for m in metrics]
    scenarios, rows, steps = results_values(run.pk, columns)
    length = int(scenarios[:, 1].max()) + 1 if len(scenarios) else 0
    present = np.zeros(length, dtype=bool)
    present[scenarios[:, 1]] = True
    # Each result row's testcase index, through its scenario id; rows of other scenarios go.
    order = np.argsort(scenarios[:, 0])
    ids, indexes = scenarios[order, 0], scenarios[order, 1]
    at = np.searchsorted(ids, rows[:, 0]).clip(max=max(len(ids) - 1, 0))
    mine = (ids[at] == rows[:, 0]) if len(ids) else np.zeros(len(rows), dtype=bool)
    rows, index = rows[mine], indexes[at[mine]]
    values, errors = {}, {}
    for i, metric in enumerate(metrics):
        column = rows[:, 3 + i]
        valued = ~np.isnan(column)
        counts = np.bincount(index[valued], minlength=length)
        sums = np.bincount(index[valued], weights=column[valued], minlength=length)
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        step = steps.index(metric.steps[run.pk]) + 1
        failed = (rows[:, 1] == step) & (rows[:, 2] == 1)
        errored = np.bincount(index[failed], minlength=length) > 0
        values[metric.name], errors[metric.name] = value, errored & np.isnan(value)
    return RunValues(present, values, errors, binary=run.repeats == 1)


class _ValuesCache:
    """Per-process LRU of runs' value arrays and of the statistics computed from them, bounded
    in bytes, entries and age: a finished run's values change only when its results do (which
    moves ``progressed_at``) or its read model does (``metrics_refreshed_at``), both stamped."""

    def __init__(self, max_bytes: int = 64 * 2**20, max_age: float = 600.0, max_entries: int = 256):
        self.max_bytes, self.max_age, self.max_entries = max_bytes, max_age, max_entries
        self.entries: OrderedDict[tuple, tuple[tuple, float, object]] = OrderedDict()
        self.lock = threading.Lock()  # threaded servers share the process

    def get(self, key: tuple, stamp: tuple):
        with self.lock:
            entry = self.entries.get(key)
            if entry is None or entry[0] != stamp or time.monotonic() - entry[1] > self.max_age:
                return None
            self.entries.move_to_end(key)
            return entry[2]

    def put(self, key: tuple, stamp: tuple, found) -> None:
        with self.lock:
            self.entries[key] = (stamp, time.monotonic(), found)
            self.entries.move_to_end(key)
            while len(self.entries) > self.max_entries or self.max_bytes < sum(
                getattr(e[2], "nbytes", 0) for e in self.entries.values()
            ):
                self.entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


_CACHE = _ValuesCache()


def values_cache_clear() -> None:
    """Forget every run's cached values (benchmarks and tests time and count the first view)."""
    _CACHE.clear()


def comparison_stats(comparison: Comparison, values: dict[int, RunValues]) -> list[dict]:
    """Per shared metric with data: each run's summary (mean or rate, count, errors) and, for
    each candidate, the paired test against the baseline with how many pairs it used."""
    base = comparison.baseline
    # Pairs are counted among the scenarios both runs have (each candidate's, once).
    shared = {run.pk: values[base.pk].present & values[run.pk].present for run in comparison.runs}
    out = []
    for metric in comparison.metrics:
        summaries, valued = [], {}  # valued: per run, its scenarios with a value of the metric
        for run in comparison.runs:
            v = values[run.pk]
            column = v.values[metric.name]
            valued[run.pk] = mask = ~np.isnan(column)
            count = int(np.count_nonzero(mask))
            summaries.append(
                {
                    "run": run.pk,
                    "value": float(column[mask].mean()) if count else None,
                    "count": count,
                    "errors": int(np.count_nonzero(v.errors[metric.name])),
                }
            )
        if not any(s["count"] or s["errors"] for s in summaries):
            continue  # a key no run has a value or an error for: nothing to show
        tests = []
        b_values = values[base.pk].values[metric.name]
        b_errors = values[base.pk].errors[metric.name]
        for run in comparison.candidates:
            c_values = values[run.pk].values[metric.name]
            c_errors = values[run.pk].errors[metric.name]
            both = valued[base.pk] & valued[run.pk]
            unpaired = shared[run.pk] & ~both  # both have the scenario, not both a value
            errored = int(np.count_nonzero(unpaired & (b_errors | c_errors)))
            binary = not metric.numeric and values[base.pk].binary and values[run.pk].binary
            test = paired_test(
                b_values[both],
                c_values[both],
                binary=binary,
                higher_is_better=metric.higher_is_better,
            )
            test |= {
                "run": run.pk,
                "excluded": {
                    "errors": errored,
                    "missing": int(np.count_nonzero(unpaired)) - errored,
                },
            }
            tests.append(test)
        out.append(
            {
                "metric": metric.name,
                "evaluator": metric.evaluator,
                "key": metric.key,
                "type": metric.type,
                "higher_is_better": metric.higher_is_better,
                "runs": summaries,
                "tests": tests,
            }
        )
    return out


def aligned_indexes(
    comparison: Comparison,
    values: dict[int, RunValues],
    *,
    metrics: list[SharedMetric],
    show: str = "",
) -> np.ndarray:
    """Testcase indexes in order, kept by ``show``: ``regressions`` / ``improvements`` (some
    candidate's value moved against / along the metric's direction from the baseline's) or
    ``changed`` (a value differs, or one side errored where the other has a value)."""
    present = np.logical_or.reduce([v.present for v in values.values()])
    if show not in FILTERS:
        return np.flatnonzero(present)
    base = values[comparison.baseline.pk]
    keep = np.zeros_like(present)
    for metric in metrics:
        b = base.values[metric.name]
        for run in comparison.candidates:
            c = values[run.pk].values[metric.name]
            with np.errstate(invalid="ignore"):
                diff = (c - b) * (1 if metric.higher_is_better else -1)
            if show == "regressions":
                keep |= diff < -TOLERANCE
            elif show == "improvements":
                keep |= diff > TOLERANCE
            else:
                c_errors = values[run.pk].errors[metric.name]
                flipped = (base.errors[metric.name] & ~np.isnan(c)) | (c_errors & ~np.isnan(b))
                keep |= (np.abs(diff) > TOLERANCE) | flipped
    return np.flatnonzero(keep & present)


def aligned_rows(
    comparison: Comparison,
    values: dict[int, RunValues],
    indexes: np.ndarray | list[int],
    *,
    metrics: list[SharedMetric],
) -> list[dict]:
    """The rows at these testcase indexes: the inputs, and per run its outputs, each metric's
    value or error, and the delta from the baseline (candidate - baseline)."""
    indexes = [int(i) for i in indexes]
    runs = comparison.runs
    outputs = {run.pk: _outputs_step(run) for run in runs}
    read = aligned_cells(
        [run.pk for run in runs],
        indexes,
        steps=sorted({m.steps[run.pk] for m in metrics for run in runs}),
        outputs_steps=sorted({step for step in outputs.values() if step}),
    )
    base = comparison.baseline.pk
    rows = []
    for index in indexes:
        cells = []
        for run in runs:
            v = values[run.pk]
            scenario = read.scenarios.get((run.pk, index))
            cell = {"run": run.pk, "present": scenario is not None, "values": {}, "errors": {}}
            if scenario is not None:
                cell["status"] = scenario[1]
                cell["outputs"] = read.outputs.get((scenario[0], outputs[run.pk]))
            for metric in metrics:
                value = _value(v, metric, index)
                if value is not None:
                    cell["values"][metric.name] = value
                elif v.errors[metric.name][index]:
                    error = scenario and read.errors.get((scenario[0], metric.steps[run.pk]))
                    cell["errors"][metric.name] = error or {"code": "error", "message": ""}
            if run.pk != base:
                deltas = {m.name: _delta(values[base], v, m, index) for m in metrics}
                cell["deltas"] = {k: d for k, d in deltas.items() if d is not None}
            cells.append(cell)
        first = next((r for r in runs if (r.pk, index) in read.scenarios), None)
        inputs = {}
        if first is not None:  # the first run that has the row, through its own columns
            read_inputs = _inputs(first, read.scenarios[(first.pk, index)][2])
            inputs = {c: read_inputs.get(c) for c in comparison.input_columns}
        rows.append({"index": index, "inputs": inputs, "runs": cells})
    return rows


def _outputs_step(run: Run) -> str | None:
    return next((m["step"]["key"] for m in run.mappings if m["column"]["kind"] == "outputs"), None)


def _inputs(run: Run, inputs: dict) -> dict:
    """The run's input columns of one scenario, read as the scenario table reads them."""
    out = {}
    for mapping in run.mappings:
        if mapping["column"]["kind"] == "input":
            path = mapping["step"]["path"].split(".")
            wrapped = {"attributes": {"ag": {"data": {"inputs": inputs}}}}
            out[mapping["column"]["name"]] = (
                dig(inputs, path[1:]) if path[0] == "data" else dig(wrapped, path)
            )
    return out


def _value(v: RunValues, metric: SharedMetric, index: int) -> float | bool | None:
    value = v.values[metric.name][index]
    if np.isnan(value):
        return None
    if not metric.numeric and v.binary:
        return bool(value)
    return float(value)


def _delta(base: RunValues, v: RunValues, metric: SharedMetric, index: int) -> float | None:
    b, c = base.values[metric.name][index], v.values[metric.name][index]
    if np.isnan(b) or np.isnan(c):
        return None
    return round(float(c - b), 12)  # 0.6 - 0.9 is -0.3, not -0.30000000000000004


def comparison_report(
    comparison: Comparison,
    *,
    metric: str = "",
    show: str = "",
    offset: int = 0,
    limit: int = 50,
    stats: bool = True,
) -> dict:
    """What the page and the API show: the statistics (unless ``stats`` is false) and one page
    of aligned rows, for one metric or all shared ones."""
    chosen = comparison.chosen(metric)
    values = comparison_values(comparison)  # every metric: one read serves every view
    indexes = aligned_indexes(comparison, values, metrics=chosen, show=show)
    limit = max(limit, 1)
    if offset >= len(indexes):  # past the end: the last page
        offset = max(len(indexes) - 1, 0) // limit * limit
    return {
        "metrics": chosen,
        "stats": _stats_cached(comparison, values) if stats else [],
        "total": len(indexes),
        "offset": offset,
        "rows": aligned_rows(comparison, values, indexes[offset : offset + limit], metrics=chosen),
    }


def _stats_cached(comparison: Comparison, values: dict[int, RunValues]) -> list[dict]:
    """``comparison_stats``, kept beside the values it comes from while no run changes: a view
    after the first recomputes nothing over the scenarios."""
    keys = [_cache_key(run, comparison.metrics) for run in comparison.runs]
    key, stamp = ("stats", *(k for k, _ in keys)), tuple(s for _, s in keys)
    found = _CACHE.get(key, stamp)
    if found is None:
        found = comparison_stats(comparison, values)
        if not any(run.is_active for run in comparison.runs):
            _CACHE.put(key, stamp, found)
    return copy.deepcopy(found)  # callers may decorate what they get
