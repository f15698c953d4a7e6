"""A user's whole path through evalsite in a real browser: make an evaluator, upload a testset,
run it, read and sort and filter the results, drill in and step with the keyboard, correct a
judgement by hand, compare two runs, and export CSV."""

from __future__ import annotations

from pathlib import Path

import pytest

from runs.models import Annotation, Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CSV = b"""country,correct_answer,outputs,outputs_v2
France,Paris,Paris,Paris
Italy,Rome,Milan,Rome
Spain,Madrid,I'm sorry,Madrid
Japan,Tokyo,Tokyo,Tokyo
"""


def _new_evaluator(page):
    page.click("text=Evaluators")
    page.click("text=New evaluator")
    page.click("a.card:has-text('Exact match')")
    page.fill("#id_name", "Capital exact")
    page.click("button:has-text('Create evaluator')")
    page.wait_for_selector("h1:has-text('Capital exact')")


def _upload_testset(page, tmp_path):
    path = tmp_path / "capitals.csv"
    path.write_bytes(CSV)
    page.click("nav.sidebar >> text=Testsets")
    page.goto(page.url.replace("/testsets/", "/testsets/new"))
    page.set_input_files("input[type=file]", str(path))
    page.fill("#id_name", "Capitals")
    page.click("button:has-text('Upload')")
    page.wait_for_selector("text=France")


def _start_run(page, column: str, name: str):
    page.click("nav.sidebar >> text=Runs")
    page.click("text=New run")
    page.fill("#id_name", name)
    page.select_option("#id_testset", label="Capitals")
    page.fill("#id_outputs_column", column)
    page.check("label:has-text('Capital exact') >> input")
    page.click("button:has-text('Start run')")
    page.wait_for_selector("#run-progress .badge-success")


def test_it_walks_the_whole_flow(logged_in, shoot, tmp_path):
    page = logged_in
    _new_evaluator(page)
    shoot(page, "evaluator")
    _upload_testset(page, tmp_path)
    shoot(page, "testset")
    _start_run(page, "outputs", "Capitals v1")
    shoot(page, "run")
    assert (
        page.locator(".metric-card:has-text('capital-exact.success') .value")
        .inner_text()
        .startswith("50")
    )

    # Sort by the evaluator's column (descending twice-click) and filter failed scenarios.
    page.click("#run-scenarios th a:has-text('capital-exact.success')")
    page.wait_for_selector("th.sort-asc")
    page.click("#run-scenarios th a:has-text('capital-exact.success')")
    page.wait_for_selector("th.sort-desc")
    first = page.locator("#run-scenarios tbody tr").first.inner_text()
    assert "France" in first or "Japan" in first
    page.check("input[name=failed]")
    page.wait_for_function("document.querySelectorAll('#run-scenarios tbody tr').length === 2")
    rows = page.locator("#run-scenarios tbody").inner_text()
    assert "Italy" in rows and "Spain" in rows and "France" not in rows
    shoot(page, "run-filtered")

    # Drill in, step with the keyboard.
    page.click("#run-scenarios tbody tr >> nth=0 >> td.num a")
    page.wait_for_selector("h1:has-text('Scenario')")
    first_heading = page.locator("h1").inner_text()
    page.keyboard.press("j")
    page.wait_for_function(f"document.querySelector('h1').innerText !== {first_heading!r}")
    page.keyboard.press("k")
    page.wait_for_function(f"document.querySelector('h1').innerText === {first_heading!r}")
    shoot(page, "drill-in")

    # Correct the judgement by hand: Italy's "Milan" is marked a success.
    run = Run.objects.get(name="Capitals v1")
    italy = run.scenarios.get(inputs__country="Italy")
    page.goto(f"/p/acme/runs/{run.pk}/scenarios/{italy.index}/")
    page.click("summary:has-text('Correct this judgement')")
    page.check(".annotation-form input[type=checkbox]")
    page.click(".annotation-form button:has-text('Save')")
    page.wait_for_selector(".message-success")
    annotation = Annotation.objects.get(results__scenario=italy)
    assert annotation.outputs == {"success": True} and annotation.origin == "human"
    assert annotation.history[0]["outputs"] == {"success": False}
    shoot(page, "annotated")

    # A second run on the same testset, then compare the two.
    _start_run(page, "outputs_v2", "Capitals v2")
    v2 = Run.objects.get(name="Capitals v2")
    page.goto(f"/p/acme/runs/compare?runs={run.pk},{v2.pk}&baseline={run.pk}")
    page.wait_for_selector("text=vs baseline")
    assert "better" in page.content() or "inconclusive" in page.content()
    shoot(page, "compare")

    # Export the first run's failed scenarios as CSV: the filters apply to the export.
    page.goto(f"/p/acme/runs/{run.pk}/?failed=1")
    with page.expect_download() as download:
        page.click("text=Export CSV")
    text = Path(download.value.path()).read_text(encoding="utf-8")
    header, *lines = text.strip().splitlines()
    assert "country" in header and len(lines) == 1  # only Spain still fails after the correction
    assert "Spain" in lines[0]
