"""Traces REST API: batch ingestion, read, list with filters, access."""

import pytest

from evaluators.samples import SAMPLE_TRACE
from runs.models import Span, Trace
from runs.traces import trace_dict, trace_ingest

URL = "/api/v1/traces"


def span(trace_id, span_id, parent_id=None, start="10:00:00", **extra):
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_id": parent_id,
        "name": extra.pop("name", span_id),
        "start_time": f"2026-11-20T{start}Z",
        "end_time": f"2026-11-20T{start}.5Z",
        **extra,
    }


def test_it_ingests_a_batch_and_answers_trace_ids_and_span_count(api, project):
    body = {"spans": [span("t1", "a"), span("t1", "b", "a"), span("t2", "a")]}
    response = api.post(URL, body, format="json")
    assert response.status_code == 200
    assert response.json() == {"traces": ["t1", "t2"], "spans": 3}
    assert Trace.objects.filter(project=project).count() == 2


@pytest.mark.parametrize(
    "body",
    [
        SAMPLE_TRACE,
        {"traces": [SAMPLE_TRACE]},
        {"spans": [SAMPLE_TRACE]},
        [SAMPLE_TRACE],
    ],
)
def test_it_takes_trace_dicts_in_every_documented_wrapping(api, body):
    response = api.post(URL, body, format="json")
    assert response.status_code == 200
    assert response.json() == {"traces": [SAMPLE_TRACE["trace_id"]], "spans": 3}


def test_it_reads_a_trace_exactly_as_trace_dict(api, project):
    trace_ingest(project=project, spans=[SAMPLE_TRACE])
    response = api.get(f"{URL}/{SAMPLE_TRACE['trace_id']}")
    assert response.status_code == 200
    assert response.json() == trace_dict(Trace.objects.get())


def test_it_round_trips_a_read_trace_unchanged(api):
    api.post(URL, SAMPLE_TRACE, format="json")
    first = api.get(f"{URL}/{SAMPLE_TRACE['trace_id']}").json()
    assert api.post(URL, first, format="json").status_code == 200
    assert api.get(f"{URL}/{SAMPLE_TRACE['trace_id']}").json() == first


def test_it_names_the_bad_field_and_stores_nothing(api):
    body = {"spans": [span("t1", "a"), span("t1", "b", "a", start="25:00:00")]}
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "spans[1].start_time: invalid datetime"
    assert error["fields"] == {"spans[1].start_time": ["invalid datetime"]}
    assert not Span.objects.exists()


def test_it_refuses_a_body_that_is_not_spans(api):
    response = api.post(URL, {"hello": "world"}, format="json")
    assert response.status_code == 400
    assert "spans" in response.json()["error"]["fields"]


def test_it_answers_413_over_the_span_limit(api, settings):
    settings.EVALSITE_TRACE_MAX_SPANS = 2
    body = {"spans": [span("t", "a"), span("t", "b"), span("t", "c")]}
    response = api.post(URL, body, format="json")
    assert response.status_code == 413
    assert response.json()["error"] == {
        "status": 413,
        "code": "too_large",
        "message": "spans: 3 spans in one request; the limit is 2",
        "fields": {},
    }
    assert not Span.objects.exists()


def test_it_answers_413_over_the_body_limit(api, settings):
    settings.EVALSITE_TRACE_MAX_BODY_BYTES = 50
    response = api.post(URL, {"spans": [span("t", "a")]}, format="json")
    assert response.status_code == 413
    assert "the limit is 50" in response.json()["error"]["message"]


def test_it_lets_viewers_read_but_not_ingest(viewer_api, project):
    trace_ingest(project=project, spans=[span("t1", "a")])
    assert viewer_api.get(f"{URL}/t1").status_code == 200
    assert viewer_api.get(URL).json()["results"][0]["trace_id"] == "t1"
    response = viewer_api.post(URL, {"spans": [span("t2", "a")]}, format="json")
    assert response.status_code == 403
    assert not Trace.objects.filter(trace_id="t2").exists()


def test_it_hides_other_projects_traces(api, outsider_api, project):
    trace_ingest(project=project, spans=[span("secret", "a")])
    assert outsider_api.get(f"{URL}/secret").status_code == 404
    assert outsider_api.get(URL).json()["results"] == []
    # The same trace id in another project is another trace.
    assert (
        outsider_api.post(URL, {"spans": [span("secret", "x")]}, format="json").status_code == 200
    )
    assert list(api.get(f"{URL}/secret").json()["spans"]) == ["a"]


def test_it_filters_traces(api, project):
    trace_ingest(
        project=project,
        spans=[
            span("t1", "a", name="qa", attributes={"ag": {"meta": {"env": "prod"}}}),
            span("t2", "a", name="qa", start="11:00:00", status="error"),
            span("t3", "a", name="summarise", start="12:00:00"),
            span(
                "t3",
                "b",
                "a",
                start="12:00:00",
                attributes={"gen_ai.request.model": "gpt-4o-mini", "retries": 2},
            ),
        ],
    )

    def ids(query):
        response = api.get(f"{URL}?{query}")
        assert response.status_code == 200, response.json()
        return [t["trace_id"] for t in response.json()["results"]]

    assert ids("name=qa") == ["t2", "t1"]
    assert ids("search=summ") == ["t3"]
    assert ids("status=error") == ["t2"]
    assert ids("since=2026-11-20T10:30:00Z&until=2026-11-20T11:30:00Z") == ["t2"]
    assert ids("since=2026-11-20") == ["t3", "t2", "t1"]
    assert ids("attr.ag.meta.env=prod") == ["t1"]
    assert ids("attr.gen_ai.request.model=gpt-4o-mini") == ["t3"]
    assert ids("attr.retries=2") == ["t3"]
    assert ids("attr.ag.meta.env=dev") == []
    assert ids("source=api") == ["t3", "t2", "t1"]


def test_it_names_a_bad_filter(api):
    response = api.get(f"{URL}?since=last-week")
    assert response.status_code == 400
    assert "since" in response.json()["error"]["fields"]


def test_it_pages_with_a_cursor(api, project):
    trace_ingest(project=project, spans=[span(f"t{i}", "a") for i in range(5)])
    first = api.get(f"{URL}?limit=2").json()
    assert [t["trace_id"] for t in first["results"]] == ["t4", "t3"]
    second = api.get(first["next"]).json()
    assert [t["trace_id"] for t in second["results"]] == ["t2", "t1"]
    summary = second["results"][0]
    assert set(summary) >= {"name", "duration_ms", "tokens", "cost", "span_count", "status"}
