"""Trace pages, full and as HTMX fragments."""

from evaluators.samples import SAMPLE_TRACE
from runs.traces import trace_ingest, trace_record
from runs.views import traces as views

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_it_lists_traces_with_filters(viewer_client, project):
    trace_ingest(project=project, spans=[SAMPLE_TRACE])
    trace_record(project=project, name="failing-app", inputs={}, outputs=None, error="boom")
    page = viewer_client.get("/p/acme/traces/").content.decode()
    assert "<html" in page and "capital_qa" in page and "failing-app" in page
    assert 'id="trace-table"' in page
    page = viewer_client.get("/p/acme/traces/?status=error").content.decode()
    assert "failing-app" in page and "capital_qa" not in page


def test_it_swaps_only_the_table_for_htmx(viewer_client, project):
    trace_ingest(project=project, spans=[SAMPLE_TRACE])
    trace_record(project=project, name="other-app", inputs={}, outputs="x")
    fragment = viewer_client.get("/p/acme/traces/?q=capital", **HTMX).content.decode()
    assert fragment.strip().startswith('<div id="trace-table">')
    assert "capital_qa" in fragment and "other-app" not in fragment
    assert "<html" not in fragment


def test_it_shows_a_bad_filter_instead_of_failing(viewer_client, project):
    response = viewer_client.get("/p/acme/traces/?since=tomorrow-ish", **HTMX)
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()


def test_it_pages_to_older_traces(viewer_client, project, monkeypatch):
    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    for i in range(3):
        trace_record(project=project, name=f"app-{i}", inputs={}, outputs=i)
    page = viewer_client.get("/p/acme/traces/?status=ok").content.decode()
    assert "app-2" in page and "app-1" in page and "app-0" not in page
    assert "Older" in page and "before=" in page
    link = next(part for part in page.split('"') if "before=" in part).replace("&amp;", "&")
    assert "status=ok" in link
    fragment = viewer_client.get(link, **HTMX).content.decode()
    assert "app-0" in fragment and "app-2" not in fragment and "Newest" in fragment


def test_it_shows_a_trace_as_a_span_tree(viewer_client, project):
    trace_ingest(project=project, spans=[SAMPLE_TRACE])
    response = viewer_client.get(f"/p/acme/traces/{SAMPLE_TRACE['trace_id']}/")
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count('<details class="span') == 3
    assert 'data-kind="retriever"' in page and 'data-kind="llm"' in page
    assert "The capital of France is Paris." in page
    assert "&quot;country&quot;: &quot;France&quot;" in page  # inputs as pretty JSON
    assert "1,235 ms" in page and "51" in page and "$0.000039" in page
    assert "gen_ai.request.model" in page


def test_it_shows_the_error_and_folds_long_text(viewer_client, project):
    trace = trace_record(
        project=project,
        name="essay",
        inputs={"topic": "tides"},
        outputs="The sea rises. " * 100,
        error="the judge timed out",
    )
    page = viewer_client.get(f"/p/acme/traces/{trace.trace_id}/").content.decode()
    assert "span-error" in page and "the judge timed out" in page
    assert '<details class="fold"><summary><span class="preview">' in page


def test_it_hides_other_projects_traces_from_pages(outsider_client, project):
    trace = trace_record(project=project, name="secret", inputs={}, outputs="x")
    assert outsider_client.get("/p/acme/traces/").status_code == 404
    assert outsider_client.get(f"/p/other/traces/{trace.trace_id}/").status_code == 404
    assert "secret" not in outsider_client.get("/p/other/traces/").content.decode()
