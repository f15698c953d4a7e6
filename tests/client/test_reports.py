"""The CI reports: the Markdown summary (metrics table, reasons, regressed scenarios linked to
their drill-ins, the history's regressed and flaky cases; cell text that cannot break the table)
and JUnit XML (one test case per scenario x evaluator, failures, errors, parseable whatever the
outputs hold)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from evalsite_client.gate import Options, decide, undecided
from evalsite_client.models import ScenarioTable
from evalsite_client.reports import Links, gate_markdown, junit_xml, md_cell, run_markdown

from tests.client.payloads import BASE, CAND, comparison, history, metric, regressed_row, run

LINKS = Links("https://evals.example.com", "acme")


def _gate_md(decision, **kwargs):
    return gate_markdown(decision, baseline=run(BASE), candidate=run(CAND), links=LINKS, **kwargs)


def test_the_summary_has_a_row_per_metric_with_baseline_candidate_delta_interval_and_verdict():
    payload = comparison(metric(verdict="worse", base=0.9, cand=0.6))
    text = _gate_md(decide(payload, run(), Options()), history=history())
    assert text.startswith("## ❌ evalsite gate: regression\n")
    assert "| Metric | Baseline | Candidate | Delta | 95% interval | Pairs | Verdict |" in text
    assert (
        "| `exact.success` | 90.0% (n=200) | 60.0% (n=200) | -30.0 pp | [-36.0, -24.0] pp | 200 "
        "| ❌ worse (p < 0.001) |"
    ) in text
    assert "- exact.success: worse (p &lt; 0.001, n=200)" in text
    compare = "https://evals.example.com/p/acme/runs/compare?runs=10,12&baseline=10"
    assert f"([comparison]({compare}))" in text
    assert "[#12 run 12](https://evals.example.com/p/acme/runs/12/)" in text


def test_the_summary_lists_regressed_scenarios_with_links_to_their_drill_ins():
    rows = [regressed_row(4), regressed_row(9, "What | is <b>this</b>?\nsecond line")]
    payload = comparison(metric(verdict="worse"), rows=rows, count=60)
    text = _gate_md(
        decide(payload, run(), Options()), regressions=payload.rows, regression_count=60
    )
    assert "### Regressed scenarios (60)" in text
    link = "[#4](https://evals.example.com/p/acme/runs/12/scenarios/4/)"
    assert f"| {link} | question: What is 2 + 2? | exact.success: pass → fail |" in text
    assert "What \\| is &lt;b&gt;this&lt;/b&gt;? second line" in text
    assert "… and 58 more: [all regressions](" in text and "&filter=regressions)" in text


def test_long_lists_are_folded_in_a_pull_request_comment():
    rows = [regressed_row(i) for i in range(11)]
    payload = comparison(metric(verdict="worse"), rows=rows)
    text = _gate_md(
        decide(payload, run(), Options()), regressions=payload.rows, regression_count=11
    )
    assert "### Regressed scenarios (11)\n\n<details><summary>11 scenarios</summary>\n\n|" in text
    assert (
        "scenarios/10/) | question: What is 2 + 2? | exact.success: pass → fail |\n\n</details>"
        in text
    )
    short = comparison(metric(verdict="worse"), rows=rows[:3])
    text = _gate_md(decide(short, run(), Options()), regressions=short.rows, regression_count=3)
    assert "<details>" not in text


def test_the_summary_lists_the_historys_regressed_and_flaky_cases_separately():
    payload = comparison(metric(verdict="better", cand=0.95))
    text = _gate_md(decide(payload, run(), Options(), history(2, 1)), history=history(2, 1))
    assert text.startswith("## ✅ evalsite gate: no regression")
    assert "### Regressed test cases (2)" in text and "### Flaky test cases (1)" in text
    regressed = text.split("### Regressed test cases")[1].split("### Flaky")[0]
    assert (
        "| [#1](https://evals.example.com/p/acme/runs/12/scenarios/1/) | question 1 | `exact` | 1 | ✓ ✓ ✗ |"
        in regressed
    )
    assert "✓ ✗ ✓ ✗" in text.split("### Flaky test cases")[1]
    assert (
        "1 flaky test case(s) of the gated evaluators, 1 failing in the candidate; they fail "
        "the gate only with --fail-on-flaky" in text
    )


def test_the_summary_says_when_the_history_is_not_available():
    payload = comparison(metric(verdict="better"))
    note = "not available on this server (GET /testsets/{ref}/history: 404)"
    text = _gate_md(decide(payload, run(), Options()), history_note=note)
    assert f"_Test-case history: {md_cell(note, 200)}_" in text
    assert "No scenario regressed on the gated metrics." in text


def test_a_gate_that_could_not_compare_says_why():
    decision = undecided("no baseline: found no run tagged branch=main", candidate_id=CAND)
    text = gate_markdown(decision, baseline=None, candidate=run(CAND), links=LINKS)
    assert text.startswith("## ⚠️ evalsite gate: could not decide")
    assert "- no baseline: found no run tagged branch=main" in text
    assert "| Metric |" not in text


def test_a_table_cell_keeps_to_one_line_and_cannot_inject_markup():
    cell = md_cell("a|b\n<script>x</script> `code` [link](http://x) *em*")
    assert "\n" not in cell and "<" not in cell
    assert cell == ("a\\|b &lt;script&gt;x&lt;/script&gt; \\`code\\` \\[link\\](http://x) \\*em\\*")
    assert md_cell("x" * 100, 10) == "x" * 9 + "…"


def _table(rows: list[dict]) -> ScenarioTable:
    return ScenarioTable.model_validate(
        {"count": len(rows), "columns": run().mappings, "rows": rows}
    )


def _row(index: int, success=None, error=None, outputs="4", question="What is 2 + 2?"):
    values = {"question": question, "outputs": outputs}
    if success is not None:
        values["exact.success"] = success
    errors = {"exact.success": error} if error else {}
    return {"index": index, "status": "success", "values": values, "errors": errors}


def test_junit_has_one_case_per_scenario_and_evaluator_failing_what_the_evaluator_failed():
    table = _table(
        [
            _row(0, True),
            _row(1, False, outputs="5"),
            _row(2, error={"code": "timeout", "message": "judge took too long"}),
            _row(3),
        ]
    )
    root = ET.fromstring(junit_xml(run(), [table], LINKS))
    assert root.tag == "testsuites"
    counts = {"tests": "4", "failures": "1", "errors": "1", "skipped": "1"}
    assert counts.items() <= root.attrib.items()
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "exact (run #12)"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"scenario {i}" for i in range(4)]
    assert {c.get("classname") for c in cases} == {"evalsite.qa.exact"}
    assert cases[0].find("failure") is None and cases[0].find("error") is None
    assert cases[1].find("failure").get("message") == "exact judged it failed"
    assert cases[2].find("error").get("message") == "judge took too long"
    assert cases[2].find("error").get("type") == "timeout"
    assert cases[3].find("skipped") is not None
    out = cases[1].find("system-out").text
    assert "drill-in: https://evals.example.com/p/acme/runs/12/scenarios/1/" in out
    assert "outputs: 5" in out


def test_junit_stays_parseable_whatever_the_outputs_hold():
    nasty = "a < b && \"c\" > 'd' ]]> \x00\x1b[31m\x07 end \ud800"
    table = _table([_row(0, False, outputs=nasty, question=nasty)])
    data = junit_xml(run(name=nasty), [table], LINKS)
    root = ET.fromstring(data)  # would raise on an unescaped or forbidden character
    out = root.find("testsuite/testcase/system-out").text
    assert "a < b && \"c\" > 'd' ]]>" in out and "\x00" not in out and "\x1b" not in out
    assert "\ufffd[31m\ufffd end" in out
    assert data.startswith(b"<?xml version='1.0' encoding='utf-8'?>")


def test_junit_with_a_gate_starts_with_a_case_per_gated_metric():
    payload = comparison(metric(verdict="worse"), metric("judge.success", verdict="better", n=5))
    decision = decide(payload, run(), Options())
    root = ET.fromstring(junit_xml(run(), [_table([_row(0, True)])], LINKS, decision))
    gate_suite = root.find("testsuite")
    assert gate_suite.get("name") == "evalsite gate"
    worse, small = gate_suite.findall("testcase")
    assert worse.get("name") == "exact.success" and worse.find("failure") is not None
    assert "worse" in worse.find("failure").get("message")
    assert small.find("error").get("type") == "could not decide"
    assert root.get("tests") == "3" and root.get("failures") == "1" and root.get("errors") == "1"


def test_a_run_summary_shows_each_evaluator_metric():
    metrics = {
        "evaluator-exact-v1": {
            "success": {"type": "binary", "rate": 0.875, "count": 8, "errors": 1}
        }
    }
    text = run_markdown(run(), LINKS, metrics)
    assert "| `exact.success` | 87.5% | 8 | 1 |" in text
    assert "[#12 run 12](https://evals.example.com/p/acme/runs/12/): success" in text
