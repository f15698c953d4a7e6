"""Replaying production in a real browser: filter the traces list, "Replay as testset" with those
filters, choose the new version and an evaluator, and land on the comparison of the new version
against production's own answers (runs execute inline in the live server; the new version is a
real local HTTP server)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from evaluators.services import evaluator_create
from runs.annotations import annotation_create
from runs.applications import application_create
from runs.models import Run, Testset
from runs.traces import trace_ingest
from tests.servers import Reply

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TRUTH = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid"}
ANSWERED = {"France": "Paris", "Germany": "Bonn", "Italy": "Rome", "Spain": "Barcelona"}


@pytest.fixture
def production(project):
    """Four production answers to capital questions (two wrong), each corrected by a person,
    and a trace of another workflow the filter leaves out."""
    spans = [
        {
            "trace_id": f"prod-{country.lower()}",
            "span_id": "root",
            "name": "capital_qa",
            "start_time": f"2026-03-01T10:0{n}:00Z",
            "attributes": {"ag": {"data": {"inputs": {"country": country}, "outputs": answer}}},
        }
        for n, (country, answer) in enumerate(ANSWERED.items())
    ]
    spans.append(
        {
            "trace_id": "prod-summary",
            "span_id": "root",
            "name": "summarise",
            "start_time": "2026-03-01T10:09:00Z",
            "attributes": {"ag": {"data": {"inputs": {"text": "…"}, "outputs": "…"}}},
        }
    )
    trace_ingest(project=project, spans=spans)
    for country, truth in TRUTH.items():
        annotation_create(
            project=project,
            evaluator="correction",
            trace_id=f"prod-{country.lower()}",
            outputs={"correct_answer": truth},
            origin="human",
        )
    evaluator_create(project=project, kind="exact_match", name="Exact")


@pytest.fixture
def new_version(project, http_server, settings):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True
    http_server.handler = lambda request: Reply(
        200, {"outputs": TRUTH[request.json()["inputs"]["country"]]}
    )
    return application_create(
        project=project, name="Capital QA v2", kind="http", config={"url": http_server.url}
    )


def test_it_replays_filtered_traces_and_lands_on_the_comparison(
    logged_in, production, new_version, http_server, shoot
):
    page = logged_in
    page.goto("/p/acme/traces/")
    page.fill("#id_q", "capital")
    expect(page.locator("#trace-table tbody tr")).to_have_count(4)  # swapped by htmx
    page.click("text=Replay as testset")
    page.wait_for_url("**/replay/new?**")
    assert "q=capital" in page.url and "source=traces" in page.url
    expect(page.locator("#replay-count")).to_have_text("4 production traces match")
    preview = page.locator("#replay-preview")
    assert "production_output" in preview.inner_text() and "Bonn" in preview.inner_text()
    shoot(page, "replay-new")

    page.fill("#id_name", "Capitals from production")
    page.select_option("#id_application", label="Capital QA v2")
    page.check("input[name=evaluators]")
    page.click("text=Replay and compare")
    page.wait_for_url("**/runs/compare?**")

    cards = page.locator("#compare-metrics-title + .grid")
    expect(cards).to_contain_text("exact.success")
    expect(cards).to_contain_text("+50.0 pp")  # 4 of 4 right against production's 2 of 4
    expect(page.locator("#compare-rows")).to_contain_text("Bonn")
    shoot(page, "replay-compare")
    assert len(http_server.requests) == 4
    runs = Run.objects.filter(
        testset_version__testset=Testset.objects.get(name__startswith="Capitals")
    )
    assert {run.tags["side"] for run in runs} == {"production", "candidate"}
    assert all(not run.is_active for run in runs)
