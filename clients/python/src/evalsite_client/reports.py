"""Reports for CI: a Markdown summary (a pull-request comment, a job summary) and JUnit XML (one
test case per scenario x evaluator, for CI test views)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from evalsite_client.gate import FAIL, PASS, UNDECIDED, Decision, MetricVerdict, p_text
from evalsite_client.models import ComparedRow, History, MetricComparison, Run, ScenarioTable

ICONS = {PASS: "✅", FAIL: "❌", UNDECIDED: "⚠️"}
# Characters XML 1.0 cannot carry at all (not even escaped): C0 controls but tab, LF, CR;
# surrogates; U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


@dataclass
class Links:
    """Page addresses of one project: ``Links("https://evals.example.com", "acme")``."""

    base: str
    project: str

    def page(self, path: str) -> str:
        return f"{self.base.rstrip('/')}/p/{self.project}/{path}"

    def run(self, run_id: int) -> str:
        return self.page(f"runs/{run_id}/")

    def scenario(self, run_id: int, index: int) -> str:
        return self.page(f"runs/{run_id}/scenarios/{index}/")

    def compare(self, baseline: int, candidate: int) -> str:
        return self.page(f"runs/compare?runs={baseline},{candidate}&baseline={baseline}")


# --- numbers --------------------------------------------------------------------------------


def value_text(value: float | None, metric: MetricComparison) -> str:
    if value is None:
        return "–"
    return f"{value:.1%}" if metric.type == "binary" else f"{value:.4g}"


def delta_text(delta: float | None, metric: MetricComparison) -> str:
    if delta is None:
        return "–"
    if metric.type == "binary":
        return f"{delta * 100:+.1f} pp"
    return f"{delta:+.4g}"


def interval_text(ci: list[float] | None, metric: MetricComparison) -> str:
    if not ci:
        return "–"
    low, high = ci
    if metric.type == "binary":
        return f"[{low * 100:+.1f}, {high * 100:+.1f}] pp"
    return f"[{low:+.4g}, {high:+.4g}]"


def _summary_text(summary, metric) -> str:
    if summary is None:
        return "–"
    errors = f", {summary.errors} errors" if summary.errors else ""
    return f"{value_text(summary.value, metric)} (n={summary.count}{errors})"


def verdict_text(verdict: MetricVerdict) -> str:
    if verdict.code == UNDECIDED:
        return f"{ICONS[UNDECIDED]} could not decide"
    return f"{ICONS[verdict.code]} {verdict.test.verdict} ({p_text(verdict.test.p_value)})"


# --- Markdown -------------------------------------------------------------------------------


def md_cell(value: Any, limit: int = 80) -> str:
    """Text that stays inside one table cell: no newlines, pipes escaped, HTML inert."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\|`*_[]":
        text = text.replace(char, "\\" + char)
    return text


def gate_markdown(
    decision: Decision,
    *,
    baseline: Run | None,
    candidate: Run,
    links: Links,
    regressions: list[ComparedRow] = (),
    regression_count: int = 0,
    history: History | None = None,
    history_note: str = "",
) -> str:
    """The gate's summary: the verdict, one table row per gated metric, the reasons, the
    scenarios that regressed (with links to their drill-ins), and the test-case history's
    regressed and flaky cases."""
    lines = [f"## {ICONS[decision.code]} evalsite gate: {decision.outcome}", ""]
    cand = f"[#{candidate.id} {md_cell(candidate.name, 60)}]({links.run(candidate.id)})"
    if baseline is not None:
        base = f"[#{baseline.id} {md_cell(baseline.name, 60)}]({links.run(baseline.id)})"
        compare = links.compare(baseline.id, candidate.id)
        lines += [f"Candidate {cand} against baseline {base} ([comparison]({compare})).", ""]
    else:
        lines += [f"Candidate {cand}.", ""]
    if decision.metrics:
        lines += [
            "| Metric | Baseline | Candidate | Delta | 95% interval | Pairs | Verdict |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for v in decision.metrics:
            m, test = v.metric, v.test
            lines.append(
                f"| `{v.name}` | {_summary_text(v.baseline, m)} | "
                f"{_summary_text(v.candidate, m)} | "
                f"{delta_text(test.difference if test else None, m)} | "
                f"{interval_text(test.ci if test else None, m)} | "
                f"{test.n if test else '–'} | {verdict_text(v)} |"
            )
        lines.append("")
    if decision.reasons:
        lines += ["**Why:**", "", *(f"- {md_cell(r, 300)}" for r in decision.reasons), ""]
    lines += [f"- {md_cell(n, 300)}" for n in decision.notes]
    if decision.notes:
        lines.append("")
    if baseline is not None and decision.metrics:
        lines += _regressions_md(regressions, regression_count, decision, links, baseline)
    lines += _history_md(history, history_note, links, candidate)
    return "\n".join(lines).rstrip() + "\n"


def _regressions_md(
    rows: list[ComparedRow], count: int, decision: Decision, links: Links, baseline: Run
) -> list[str]:
    candidate = decision.candidate_id
    if not count:
        return ["No scenario regressed on the gated metrics.", ""]
    names = [v.name for v in decision.metrics]
    out = [
        f"### Regressed scenarios ({count})",
        "",
        *_fold_open(len(rows), f"{len(rows)} scenarios"),
        "| Scenario | Inputs | Changed |",
        "| --- | --- | --- |",
    ]
    for row in rows:
        base, cand = row.cell(baseline.id), row.cell(candidate)
        changes = []
        for name in names:
            before = base.values.get(name, base.errors.get(name) and "error") if base else None
            after = cand.values.get(name, cand.errors.get(name) and "error") if cand else None
            if before != after:
                changes.append(f"{name}: {_short(before)} → {_short(after)}")
        link = f"[#{row.index}]({links.scenario(candidate, row.index)})"
        inputs = md_cell(inputs_text(row.inputs), 100)
        out.append(f"| {link} | {inputs} | {md_cell('; '.join(changes), 120)} |")
    out += _fold_close(len(rows))
    if count > len(rows):
        more = links.compare(baseline.id, candidate) + "&filter=regressions"
        out += ["", f"… and {count - len(rows)} more: [all regressions]({more})."]
    out.append("")
    return out


FOLD_OVER = 10  # rows: longer tables are folded (<details>) in a pull-request comment


def _fold_open(rows: int, summary: str) -> list[str]:
    return [f"<details><summary>{summary}</summary>", ""] if rows > FOLD_OVER else []


def _fold_close(rows: int) -> list[str]:
    return ["", "</details>"] if rows > FOLD_OVER else []


def inputs_text(inputs: dict[str, Any]) -> str:
    """``question: What is 2 + 2?; lang: en`` (values that are not text as JSON)."""
    return "; ".join(
        f"{k}: {v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}"
        for k, v in inputs.items()
    )


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return "pass" if value else "fail"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "–" if value is None else str(value)


HISTORY_SHOWN = 25


def _history_md(history: History | None, note: str, links: Links, candidate: Run) -> list[str]:
    if history is None:
        return [f"_Test-case history: {md_cell(note or 'not asked for', 200)}_", ""]
    out = []
    for klass, title in (("regressed", "Regressed test cases"), ("flaky", "Flaky test cases")):
        cases = [c for c in history.cases if c.klass == klass]
        total = history.counts.get(klass, len(cases))
        if not total:
            out += [f"{title}: none.", ""]
            continue
        shown = min(len(cases), HISTORY_SHOWN)
        out += [f"### {title} ({total})", "", *_fold_open(shown, f"{shown} cases")]
        out += [
            "| Case | Inputs | Evaluator | Flips | Verdicts |",
            "| --- | --- | --- | --- | --- |",
        ]
        for case in cases[:HISTORY_SHOWN]:
            link = f"[#{case.index}]({links.scenario(candidate.id, case.index)})"
            verdicts = " ".join(_verdict_mark(v) for v in case.verdicts[-12:])
            out.append(
                f"| {link} | {md_cell(case.inputs, 60)} | `{md_cell(case.evaluator, 60)}` | "
                f"{case.flips} | {verdicts} |"
            )
        if total > shown:
            out.append(f"| … {total - shown} more | | | | |")
        out += [*_fold_close(shown), ""]
    if any(line.startswith("| [#") for line in out):
        out += ["Verdicts, oldest run first: ✓ pass, ✗ fail, ! error, · no row, ~ mixed.", ""]
    return out


VERDICT_MARKS = {"pass": "✓", "fail": "✗", "error": "!", "missing": "·", "mixed": "~"}


def _verdict_mark(verdict: str) -> str:
    return VERDICT_MARKS.get(verdict, "?")


def run_markdown(run: Run, links: Links, metrics: dict[str, Any]) -> str:
    """A run's summary without a gate: status, cells, each evaluator metric's value."""
    lines = [
        f"## evalsite run [#{run.id} {md_cell(run.name, 60)}]({links.run(run.id)}): {run.status}",
        "",
        f"{run.scenario_count} scenarios, {run.done_cells}/{run.total_cells} cells, "
        f"{run.error_cells} errors.",
        "",
        "| Metric | Value | Count | Errors |",
        "| --- | --- | --- | --- |",
    ]
    for name, stats in metric_rows(run, metrics):
        if stats.get("type") == "binary":
            value = "–" if stats.get("rate") is None else f"{stats['rate']:.1%}"
        else:
            value = "–" if stats.get("mean") is None else f"{stats['mean']:.4g}"
        lines.append(
            f"| `{md_cell(name)}` | {value} | {stats.get('count', 0)} | {stats.get('errors', 0)} |"
        )
    return "\n".join(lines) + "\n"


def metric_rows(run: Run, metrics: dict[str, Any]) -> list[tuple[str, dict]]:
    """``(column name, statistics)`` of each evaluator metric of the run, in column order."""
    rows = []
    for mapping in run.mappings:
        column, step = mapping["column"], mapping["step"]
        if column.get("kind") != "annotation" or column.get("type") not in (
            "binary",
            "continuous",
            "discrete",
        ):
            continue
        key = step["path"].split("outputs.", 1)[-1]
        stats = (metrics.get(step["key"]) or {}).get(key)
        if isinstance(stats, dict):
            rows.append((column["name"], stats))
    return rows


# --- JUnit ----------------------------------------------------------------------------------


def xml_text(value: Any, limit: int = 4000) -> str:
    """Text XML 1.0 can carry (ElementTree escapes <, & and quotes; it does not drop control
    characters, which no XML parser accepts)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = _NOT_XML.sub("\ufffd", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def junit_xml(
    run: Run,
    tables: Iterable[ScenarioTable],
    links: Links,
    decision: Decision | None = None,
) -> bytes:
    """One ``<testsuite>`` per evaluator of the run, one ``<testcase>`` per scenario: a
    ``<failure>`` when the evaluator judged it failed (``success`` false), an ``<error>`` when
    the evaluation errored, ``<skipped>`` when the cell has neither value nor error. With a gate
    decision, a first suite holds one test case per gated metric."""
    root = ET.Element("testsuites", name=xml_text(f"evalsite run #{run.id} {run.name}", 200))
    if decision is not None:
        root.append(_gate_suite(decision))
    evaluators = _evaluator_columns(run)
    suites = {}
    for step_key, (slug, _) in evaluators.items():
        suites[step_key] = ET.SubElement(
            root, "testsuite", name=xml_text(f"{slug} (run #{run.id})", 200)
        )
    testset = run.testset.slug if run.testset else "scenarios"
    for table in tables:
        for row in table.rows:
            inputs = {
                c["column"]["name"]: row.values.get(c["column"]["name"])
                for c in table.columns
                if c["column"].get("kind") == "input"
            }
            for step_key, (slug, columns) in evaluators.items():
                case = ET.SubElement(
                    suites[step_key],
                    "testcase",
                    classname=xml_text(f"evalsite.{testset}.{slug}", 200),
                    name=xml_text(f"scenario {row.index}", 200),
                )
                _judge(case, row, slug, columns)
                out = {
                    "drill-in": links.scenario(run.id, row.index),
                    "inputs": inputs,
                    "outputs": row.values.get("outputs"),
                    "values": {c: row.values[c] for c in columns if c in row.values},
                }
                ET.SubElement(case, "system-out").text = xml_text(
                    "\n".join(f"{k}: {xml_text(v, 2000)}" for k, v in out.items())
                )
    for suite in root:
        _count(suite)
    _count(root)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _evaluator_columns(run: Run) -> dict[str, tuple[str, list[str]]]:
    """Annotation step key -> (evaluator slug, its columns), in the run's step order."""
    found: dict[str, tuple[str, list[str]]] = {}
    for step in run.steps_of("annotation"):
        found[step.key] = (step.evaluator_slug or step.key, [])
    for mapping in run.mappings:
        if mapping["column"].get("kind") == "annotation" and mapping["step"]["key"] in found:
            found[mapping["step"]["key"]][1].append(mapping["column"]["name"])
    return found


def _judge(case: ET.Element, row, slug: str, columns: list[str]) -> None:
    errors = [row.errors[c] for c in columns if c in row.errors]
    if errors:
        error = errors[0] if isinstance(errors[0], dict) else {"message": str(errors[0])}
        ET.SubElement(
            case,
            "error",
            message=xml_text(error.get("message") or error.get("code") or "error", 500),
            type=xml_text(error.get("code") or error.get("type") or "error", 100),
        ).text = xml_text(error.get("stacktrace") or json.dumps(error, default=str))
        return
    values = {c: row.values[c] for c in columns if c in row.values}
    if not values:
        ET.SubElement(case, "skipped", message="no value: the cell was not evaluated")
        return
    success = values.get(f"{slug}.success", next(iter(values.values())))
    if success is False:
        ET.SubElement(
            case, "failure", message=xml_text(f"{slug} judged it failed", 500), type="fail"
        ).text = xml_text(json.dumps(values, default=str))


def _gate_suite(decision: Decision) -> ET.Element:
    suite = ET.Element("testsuite", name="evalsite gate")
    if not decision.metrics:
        case = ET.SubElement(suite, "testcase", classname="evalsite.gate", name="comparison")
        _gate_outcome(case, decision.code, decision.reasons)
    for verdict in decision.metrics:
        case = ET.SubElement(
            suite, "testcase", classname="evalsite.gate", name=xml_text(verdict.name, 200)
        )
        _gate_outcome(case, verdict.code, verdict.reasons)
    return suite


def _gate_outcome(case: ET.Element, code: int, reasons: list[str]) -> None:
    text = xml_text("; ".join(reasons), 500)
    if code == FAIL:
        ET.SubElement(case, "failure", message=text, type="regression").text = text
    elif code == UNDECIDED:
        ET.SubElement(case, "error", message=text, type="could not decide").text = text


def _count(element: ET.Element) -> None:
    cases = list(element.iter("testcase"))
    element.set("tests", str(len(cases)))
    for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        element.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))
