"""The development loop's pages in a real browser: the new-run page's cost estimate swapped in
beside the form, a tagged run found from its tag's link, and a testset's case history read
class by class down to a scenario's drill-in."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from evaluators.services import evaluator_create
from runs.applications import application_create
from runs.engine import run_create, run_execute_inline
from runs.models import Run
from tests.runs.factories import make_testset

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ANSWERS = {  # one column per run, oldest first: France stays right, Spain flips, Germany regresses
    "France": ("Paris", "Paris", "Paris"),
    "Spain": ("Madrid", "Barcelona", "Madrid"),
    "Germany": ("Berlin", "Berlin", "Bonn"),
}
TRUTH = {"France": "Paris", "Spain": "Madrid", "Germany": "Berlin"}


@pytest.fixture
def history(project):
    rows = [
        {"country": c, "correct_answer": TRUTH[c], **{f"v{i}": a[i] for i in range(3)}}
        for c, a in ANSWERS.items()
    ]
    version = make_testset(project, rows, slug="capitals")
    exact = evaluator_create(project=project, kind="exact_match", name="Exact").head
    runs = []
    for i in range(3):
        app = application_create(
            project=project, name=f"Bot v{i}", kind="column", config={"outputs_column": f"v{i}"}
        )
        run = run_create(
            project=project,
            name=f"Bot v{i}",
            testset_version=version,
            application=app,
            revisions=[exact],
            tags={"branch": "main", "commit": f"c{i}"},
        )
        runs.append(run_execute_inline(run=run))
    return version, runs


def test_the_new_run_page_estimates_before_starting(logged_in, history, shoot):
    page = logged_in
    page.goto("/p/acme/runs/new")
    page.select_option("#id_testset", label="Capitals")
    page.check("input[name=evaluators]")
    page.fill("#id_outputs_column", "v0")
    page.click("text=Estimate cost")
    estimate = page.locator("#estimate")
    estimate.get_by_text("Before it starts").wait_for()
    assert "3 rows" in estimate.inner_text()
    assert "exact-v1" in estimate.inner_text()
    assert page.url.endswith("/runs/new")  # swapped in, no navigation
    shoot(page, "run-estimate")
    assert Run.objects.count() == 3  # only the fixture's


def test_a_tag_link_filters_the_runs(logged_in, history):
    page = logged_in
    page.goto("/p/acme/runs/")
    page.click("a.tag:has-text('commit: c1')")
    page.wait_for_url("**/runs/?tag=commit:c1")
    rows = page.locator("#run-table tbody tr")
    assert rows.count() == 1 and "Bot v1" in rows.first.inner_text()


def test_the_history_reads_class_by_class_down_to_a_drill_in(logged_in, history, shoot):
    _, runs = history
    page = logged_in
    page.goto("/p/acme/testsets/capitals/")
    page.click("text=Test-case history")
    page.wait_for_url("**/testsets/capitals/history")
    grid = page.locator("body")
    assert "regressed" in grid.inner_text() and "flaky" in grid.inner_text()
    shoot(page, "history")
    page.locator("a[href*='class=regressed']").first.click()
    expect(page.get_by_text("country: Spain")).to_have_count(0)  # the grid swapped
    expect(page.get_by_text("country: Germany").first).to_be_visible()
    # The candidate's cell of Germany opens that run's scenario.
    page.locator(f"a[href$='/runs/{runs[2].pk}/scenarios/2/']").first.click()
    page.wait_for_url(f"**/runs/{runs[2].pk}/scenarios/2/")
    assert "Bonn" in page.inner_text("body")
