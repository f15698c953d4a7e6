"""HTTP applications against a real local server: mapping, retries, timeouts, refusals."""

import pytest

from runs.applications import application_create, invoke_many
from tests.servers import Reply


@pytest.fixture
def allow_local(settings):
    settings.EVALSITE_APPLICATIONS_ALLOW_PRIVATE = True


def _app(project, url, **config):
    return application_create(
        project=project, name="Bot", kind="http", config={"url": url, **config}
    )


def test_it_posts_inputs_and_maps_the_outputs(project, http_server, allow_local):
    http_server.handler = lambda request: Reply(
        200, {"answer": {"text": request.json()["inputs"]["country"][:3]}}
    )
    app = _app(project, http_server.url + "/ask", outputs_path="answer.text")
    [invocation] = invoke_many(app, [{"country": "France"}])
    assert invocation.ok and invocation.outputs == "Fra"
    assert http_server.requests[0].json() == {"inputs": {"country": "France"}}
    assert invocation.duration_ms > 0


def test_it_retries_a_503_then_succeeds(project, http_server, allow_local):
    answers = iter([Reply(503, "busy"), Reply(200, {"outputs": "ok"})])
    http_server.handler = lambda request: next(answers)
    [invocation] = invoke_many(_app(project, http_server.url, retries=2), [{}])
    assert invocation.outputs == "ok"
    assert len(http_server.requests) == 2


def test_it_gives_up_after_the_retries_with_an_error(project, http_server, allow_local):
    http_server.handler = lambda request: Reply(500, "boom")
    [invocation] = invoke_many(_app(project, http_server.url, retries=1), [{}])
    assert not invocation.ok and invocation.error["code"] == "http_status"
    assert len(http_server.requests) == 2


def test_it_times_out_with_a_clear_error(project, http_server, allow_local):
    http_server.handler = lambda request: Reply(200, {"outputs": "late"}, delay=1.0)
    [invocation] = invoke_many(_app(project, http_server.url, timeout_s=0.2, retries=0), [{}])
    assert invocation.error["code"] == "timeout"
    assert "0.2 s" in invocation.error["message"]


def test_it_reports_a_missing_outputs_path(project, http_server, allow_local):
    http_server.handler = lambda request: Reply(200, {"result": 1})
    [invocation] = invoke_many(_app(project, http_server.url, retries=0), [{}])
    assert invocation.error["code"] == "outputs_path"


def test_it_refuses_loopback_unless_allowed(project, http_server):
    [invocation] = invoke_many(_app(project, http_server.url, retries=0), [{}])
    assert invocation.error["code"] == "address_refused"
    assert "EVALSITE_APPLICATIONS_ALLOW_PRIVATE" in invocation.error["message"]
    assert http_server.requests == []


def test_it_validates_the_configuration(project):
    from evalsite.errors import InvalidInput

    with pytest.raises(InvalidInput) as caught:
        application_create(project=project, name="Bad", kind="http", config={"url": "not a url"})
    assert "config.url" in caught.value.fields
